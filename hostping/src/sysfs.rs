//! Reading sysfs: the trait discovery reads through, the live reader, and recordings.
//!
//! A recording holds exactly what one discovery read (files, links, directory listings),
//! so replaying it gives the same tree, and anything it never read is "not found", as on
//! a host that lacks it. `rpingmesh-agent hostping --record FILE` writes one; the tests
//! replay the recordings in `hostping/fixtures/`.
//!
//! Paths are absolute sysfs paths (`/sys/bus/pci/devices`); the live reader maps them
//! under its root, so a copied tree can be read from a directory too.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

/// What discovery needs from sysfs.
pub trait Sysfs {
    /// A file's content.
    fn read(&self, path: &str) -> io::Result<String>;
    /// A symlink's target, as written (usually relative).
    fn read_link(&self, path: &str) -> io::Result<String>;
    /// The names in a directory, sorted.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;
}

/// The live sysfs (or a copy of it under `root`).
#[derive(Debug, Clone)]
pub struct RealSysfs {
    root: PathBuf,
}

impl RealSysfs {
    /// The host's own `/sys`.
    pub fn host() -> Self {
        Self::under("/")
    }

    /// A tree whose `sys/` directory sits under `root`.
    pub fn under(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Where a sysfs path is on disk.
    pub fn map(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

impl Sysfs for RealSysfs {
    fn read(&self, path: &str) -> io::Result<String> {
        std::fs::read_to_string(self.map(path))
    }

    fn read_link(&self, path: &str) -> io::Result<String> {
        std::fs::read_link(self.map(path)).map(|p| p.to_string_lossy().into_owned())
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(self.map(dir))? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    File(String),
    Link(String),
    Dir(Vec<String>),
}

/// A recorded sysfs: what one discovery read, replayable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recording {
    entries: BTreeMap<String, Entry>,
}

/// The first line of a recording file.
pub const RECORDING_HEADER: &str = "# rpingmesh-hostping sysfs recording v1";

/// A recording file that cannot be read back.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("sysfs recording line {line}: {reason}")]
pub struct RecordingError {
    pub line: usize,
    pub reason: String,
}

impl Recording {
    /// Adds a file (builders of test hosts use these three).
    pub fn file(&mut self, path: &str, content: &str) -> &mut Self {
        self.entries
            .insert(path.to_string(), Entry::File(content.to_string()));
        self
    }

    /// Adds a symlink.
    pub fn link(&mut self, path: &str, target: &str) -> &mut Self {
        self.entries
            .insert(path.to_string(), Entry::Link(target.to_string()));
        self
    }

    /// Adds a directory listing.
    pub fn dir(&mut self, path: &str, names: &[&str]) -> &mut Self {
        let mut names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        names.sort();
        self.entries.insert(path.to_string(), Entry::Dir(names));
        self
    }

    /// Adds `name` to the listing of `dir` (creating it).
    pub fn dir_add(&mut self, dir: &str, name: &str) -> &mut Self {
        let entry = self
            .entries
            .entry(dir.to_string())
            .or_insert(Entry::Dir(Vec::new()));
        if let Entry::Dir(names) = entry {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
                names.sort();
            }
        }
        self
    }

    /// The recording as text: a header, then one line per entry, `F`/`L`/`D`, the path, a
    /// tab, and the content (escaped: `\\`, `\n`, `\t`), the target, or the names.
    pub fn to_text(&self) -> String {
        let mut out = String::from(RECORDING_HEADER);
        out.push('\n');
        for (path, entry) in &self.entries {
            let (tag, body) = match entry {
                Entry::File(c) => ('F', escape(c)),
                Entry::Link(t) => ('L', escape(t)),
                Entry::Dir(names) => ('D', names.join(" ")),
            };
            out.push(tag);
            out.push(' ');
            out.push_str(path);
            out.push('\t');
            out.push_str(&body);
            out.push('\n');
        }
        out
    }

    /// Reads a recording back.
    pub fn parse(text: &str) -> Result<Self, RecordingError> {
        let err = |line: usize, reason: &str| RecordingError {
            line,
            reason: reason.to_string(),
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, first)) if first.trim_end() == RECORDING_HEADER => {}
            _ => return Err(err(1, &format!("expected the header {RECORDING_HEADER:?}"))),
        }
        let mut rec = Recording::default();
        for (i, line) in lines {
            let n = i + 1;
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (head, body) = line
                .split_once('\t')
                .ok_or_else(|| err(n, "no tab between the path and its content"))?;
            let (tag, path) = head
                .split_once(' ')
                .ok_or_else(|| err(n, "expected '<F|L|D> <path>'"))?;
            if !path.starts_with("/sys") {
                return Err(err(n, &format!("path {path:?} is not under /sys")));
            }
            let entry = match tag {
                "F" => Entry::File(unescape(body).map_err(|r| err(n, &r))?),
                "L" => Entry::Link(unescape(body).map_err(|r| err(n, &r))?),
                "D" => Entry::Dir(body.split_whitespace().map(str::to_string).collect()),
                other => return Err(err(n, &format!("unknown entry kind {other:?} (F, L or D)"))),
            };
            if rec.entries.insert(path.to_string(), entry).is_some() {
                return Err(err(n, &format!("{path} recorded twice")));
            }
        }
        Ok(rec)
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn not_found(path: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{path}: not in the recording"),
    )
}

fn wrong_kind(path: &str, want: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{path}: recorded, but not as a {want}"),
    )
}

impl Sysfs for Recording {
    fn read(&self, path: &str) -> io::Result<String> {
        match self.entries.get(path) {
            Some(Entry::File(c)) => Ok(c.clone()),
            Some(_) => Err(wrong_kind(path, "file")),
            None => Err(not_found(path)),
        }
    }

    fn read_link(&self, path: &str) -> io::Result<String> {
        match self.entries.get(path) {
            Some(Entry::Link(t)) => Ok(t.clone()),
            Some(_) => Err(wrong_kind(path, "link")),
            None => Err(not_found(path)),
        }
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        match self.entries.get(dir) {
            Some(Entry::Dir(names)) => Ok(names.clone()),
            Some(_) => Err(wrong_kind(dir, "directory")),
            None => Err(not_found(dir)),
        }
    }
}

/// Reads through `inner` and records every successful read.
pub struct Recorder<S> {
    inner: S,
    taken: RefCell<Recording>,
}

impl<S: Sysfs> Recorder<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            taken: RefCell::new(Recording::default()),
        }
    }

    /// What was read so far.
    pub fn recording(&self) -> Recording {
        self.taken.borrow().clone()
    }
}

impl<S: Sysfs> Recorder<S> {
    /// Notes what `path` gave, then hands it on.
    fn noted<T: Clone>(&self, path: &str, got: T, entry: fn(T) -> Entry) -> io::Result<T> {
        self.taken
            .borrow_mut()
            .entries
            .insert(path.to_string(), entry(got.clone()));
        Ok(got)
    }
}

impl<S: Sysfs> Sysfs for Recorder<S> {
    fn read(&self, path: &str) -> io::Result<String> {
        self.noted(path, self.inner.read(path)?, Entry::File)
    }

    fn read_link(&self, path: &str) -> io::Result<String> {
        self.noted(path, self.inner.read_link(path)?, Entry::Link)
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.noted(dir, self.inner.list(dir)?, Entry::Dir)
    }
}

/// The absolute path a link at `link_path` with target `target` names, `..` folded.
pub fn resolve_link(link_path: &str, target: &str) -> String {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        let mut p: Vec<&str> = link_path.split('/').filter(|s| !s.is_empty()).collect();
        p.pop();
        p
    };
    for seg in target.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(o) => return Err(format!("unknown escape \\{o}")),
            None => return Err("a trailing backslash".to_string()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_like_the_kernel_writes_them() {
        assert_eq!(
            resolve_link(
                "/sys/bus/pci/devices/0000:3b:00.0",
                "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
            ),
            "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
        );
        assert_eq!(
            resolve_link("/sys/class/net/eth0", "/sys/devices/x/net/eth0"),
            "/sys/devices/x/net/eth0"
        );
    }

    #[test]
    fn a_recording_round_trips_through_text() {
        let mut r = Recording::default();
        r.file(
            "/sys/devices/system/node/node0/meminfo",
            "Node 0 MemTotal: 1 kB\nNode 0 MemFree: 0 kB\n",
        )
        .file("/sys/x/back\\slash", "a\tb\\c")
        .link(
            "/sys/bus/pci/devices/0000:00:01.0",
            "../../../devices/pci0000:00/0000:00:01.0",
        )
        .dir("/sys/bus/pci/devices", &["0000:00:01.0", "0000:00:00.0"]);
        let again = Recording::parse(&r.to_text()).unwrap();
        assert_eq!(again, r);
        assert_eq!(
            again.list("/sys/bus/pci/devices").unwrap(),
            vec!["0000:00:00.0", "0000:00:01.0"]
        );
        assert_eq!(again.read("/sys/x/back\\slash").unwrap(), "a\tb\\c");
        assert_eq!(
            again.read("/sys/none").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            again.read("/sys/bus/pci/devices").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn a_bad_recording_says_which_line() {
        assert_eq!(Recording::parse("hello").unwrap_err().line, 1);
        let h = RECORDING_HEADER;
        let e = Recording::parse(&format!("{h}\nF /sys/a\tx\nX /sys/b\ty\n")).unwrap_err();
        assert_eq!((e.line, e.reason.contains("unknown entry kind")), (3, true));
        let e = Recording::parse(&format!("{h}\nF /etc/passwd\tx\n")).unwrap_err();
        assert!(e.reason.contains("not under /sys"), "{e}");
        let e = Recording::parse(&format!("{h}\nF /sys/a no tab\n")).unwrap_err();
        assert!(e.reason.contains("no tab"), "{e}");
        let e = Recording::parse(&format!("{h}\nF /sys/a\tx\\q\n")).unwrap_err();
        assert!(e.reason.contains("unknown escape"), "{e}");
        let e = Recording::parse(&format!("{h}\nF /sys/a\tx\nF /sys/a\ty\n")).unwrap_err();
        assert!(e.reason.contains("twice"), "{e}");
    }

    #[test]
    fn the_recorder_keeps_what_was_read() {
        let dir = std::env::temp_dir().join(format!("hp-rec-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sys/a")).unwrap();
        std::fs::write(dir.join("sys/a/f"), "v\n").unwrap();
        std::os::unix::fs::symlink("../a", dir.join("sys/l")).unwrap();
        let rec = Recorder::new(RealSysfs::under(&dir));
        assert_eq!(rec.read("/sys/a/f").unwrap(), "v\n");
        assert_eq!(rec.read_link("/sys/l").unwrap(), "../a");
        assert_eq!(rec.list("/sys/a").unwrap(), vec!["f"]);
        assert!(rec.read("/sys/a/missing").is_err());
        let r = rec.recording();
        assert_eq!(r.len(), 3);
        assert_eq!(r.read("/sys/a/f").unwrap(), "v\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
