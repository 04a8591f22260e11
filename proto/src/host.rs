//! This host's name, the one identity both binaries report (agent_id and hostname
//! defaults, the OTLP service.instance.id).

/// The kernel's hostname (`/proc/sys/kernel/hostname`, as gethostname(2) returns it);
/// "localhost" when it cannot be read.
pub fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn hostname_is_the_kernels() {
        let h = super::local_hostname();
        assert!(!h.is_empty() && !h.contains('\n'));
        if let Ok(k) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            assert_eq!(h, k.trim());
        }
    }
}

/// Where the binaries look for `file` (agent.yaml, controller.yaml) when no `--config`
/// is given, in order, as the Go version does: the working directory,
/// `$HOME/.rpingmesh`, `/etc/rpingmesh`.
pub fn config_search_path(home: Option<&str>) -> Vec<std::path::PathBuf> {
    let mut v = vec![std::path::PathBuf::from(".")];
    if let Some(h) = home.filter(|h| !h.is_empty()) {
        v.push(std::path::Path::new(h).join(".rpingmesh"));
    }
    v.push(std::path::PathBuf::from("/etc/rpingmesh"));
    v
}

/// The first `dir/file` of `dirs` that is a file.
pub fn find_config(file: &str, dirs: &[std::path::PathBuf]) -> Option<std::path::PathBuf> {
    dirs.iter().map(|d| d.join(file)).find(|p| p.is_file())
}

/// The config file a binary reads: `--config` when given, else the first `file` on the
/// search path of the `HOME` in `env`.
pub fn chosen_config(
    flag: Option<&std::path::Path>,
    file: &str,
    env: &[(String, String)],
) -> Option<std::path::PathBuf> {
    flag.map(std::path::Path::to_path_buf).or_else(|| {
        let home = env
            .iter()
            .find(|(k, _)| k == "HOME")
            .map(|(_, v)| v.as_str());
        find_config(file, &config_search_path(home))
    })
}

#[cfg(test)]
mod search_tests {
    use super::*;

    #[test]
    fn search_path_is_cwd_home_etc_in_order() {
        let p = config_search_path(Some("/home/u"));
        assert_eq!(
            p,
            [".", "/home/u/.rpingmesh", "/etc/rpingmesh"].map(std::path::PathBuf::from)
        );
        assert_eq!(config_search_path(None).len(), 2);
        let d = tempfile_dir();
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("agent.yaml"), "x: 1\n").unwrap();
        assert_eq!(
            find_config("agent.yaml", &[a.clone(), b.clone()]),
            Some(b.join("agent.yaml"))
        );
        std::fs::write(a.join("agent.yaml"), "x: 1\n").unwrap();
        assert_eq!(
            find_config("agent.yaml", &[a.clone(), b]),
            Some(a.join("agent.yaml"))
        );
        assert_eq!(find_config("controller.yaml", &[a]), None);
        let _ = std::fs::remove_dir_all(d);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rpm-search-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
