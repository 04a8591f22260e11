//! The README's "Running it yourself" commands, run as written (root: the shipped
//! controller config keeps its registry under /var/lib/rpingmesh). Only the binaries'
//! directory is this build's instead of `target/release` (the suite does not build a
//! release); every flag and config file is the README's own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rpingmesh_e2e::*;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e has a parent")
        .to_path_buf()
}

/// The shell commands of the first `sh` block after `heading` (continuations joined).
fn commands(readme: &str, heading: &str) -> Vec<String> {
    let after = &readme[readme.find(heading).expect("heading in README")..];
    let block = after
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("an sh block after the heading");
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in block.lines() {
        let line = line.trim();
        if let Some(part) = line.strip_suffix('\\') {
            cur.push_str(part);
            cur.push(' ');
            continue;
        }
        cur.push_str(line);
        if !cur.trim().is_empty() {
            out.push(cur.trim().to_string());
        }
        cur.clear();
    }
    out
}

#[test]
fn readme_block_is_parsed() {
    let cmds = commands(
        "## Run\n\n```sh\na b\nc --x 1 \\\n    --y 2 &\n```\n",
        "## Run",
    );
    assert_eq!(cmds, vec!["a b", "c --x 1  --y 2 &"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_it_yourself_works_as_written() {
    if skip_unless_root("running_it_yourself_works_as_written") {
        return;
    }
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let cmds = commands(&readme, "## Running it yourself");
    assert_eq!(cmds[0], "cargo build --release", "{cmds:?}");
    let db_dir = Path::new("/var/lib/rpingmesh");
    let created = !db_dir.exists();
    let dir = tempfile::tempdir().unwrap();
    let mut procs = Vec::new();
    for (i, c) in cmds[1..].iter().enumerate() {
        let c = c.trim_end_matches('&').trim();
        let mut words = c.split_whitespace();
        let program = words.next().unwrap();
        let name = program
            .strip_prefix("target/release/")
            .unwrap_or_else(|| panic!("README command {c:?} does not run a built binary"));
        let args: Vec<String> = words.map(String::from).collect();
        // From the repository root, as a reader would run them.
        let mut cmd = std::process::Command::new(bin(name));
        cmd.args(&args)
            .current_dir(workspace())
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(dir.path().join(format!("{i}.out"))).unwrap())
            .stderr(std::fs::File::create(dir.path().join(format!("{i}.err"))).unwrap());
        die_with_parent(&mut cmd);
        procs.push((name.to_string(), cmd.spawn().unwrap()));
        if name == CONTROLLER_BIN {
            let up = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
                let log = read_lossy(&dir.path().join(format!("{i}.err")));
                async move { log.contains("controller listening").then_some(()) }
            })
            .await;
            assert!(
                up.is_some(),
                "controller did not start:\n{}",
                read_lossy(&dir.path().join(format!("{i}.err")))
            );
        }
    }
    // The agent registered with the controller the README started.
    let op = operator("http://127.0.0.1:50051").await.unwrap();
    let registered = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let mut op = op.clone();
        async move {
            let r = list_rnics(&mut op).await.ok()?;
            r.iter()
                .any(|s| s.rnic.as_ref().is_some_and(|i| i.tor_id == "tor-a1"))
                .then_some(())
        }
    })
    .await;
    let logs: Vec<String> = (0..procs.len())
        .map(|i| tail_lines(&read_lossy(&dir.path().join(format!("{i}.err"))), 10))
        .collect();
    for (_, mut p) in procs {
        let _ = p.kill();
        let _ = p.wait();
    }
    if created {
        let _ = std::fs::remove_dir_all(db_dir);
    }
    assert!(
        registered.is_some(),
        "the agent did not register:\n{logs:#?}"
    );
}
