//! Seed 001's validation list over the shared-memory backend, between two real processes.

use std::process::{Command, Stdio};

fn pair(budget: usize, scenario: &[&str]) -> (String, String) {
    let dir = tempfile_dir();
    let path = dir.join("ring");
    let bin = env!("CARGO_BIN_EXE_rc-ring-shm");
    let p = path.to_str().unwrap();
    let server = Command::new(bin)
        .args(["serve", p, &budget.to_string(), "60"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let client = Command::new(bin)
        .args(["run", p, &budget.to_string(), "60"])
        .args(scenario)
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        client.status.success(),
        "client: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(server.status.success(), "server failed");
    (
        String::from_utf8(client.stdout).unwrap(),
        String::from_utf8(server.stdout).unwrap(),
    )
}

fn tempfile_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "rc-ring-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn field(json: &str, key: &str) -> u64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    json[at + key.len() + 3..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

#[test]
fn one_million_pipelined_messages_over_a_64_kib_ring() {
    let (c, s) = pair(64 * 1024, &["pipeline", "1000000"]);
    assert_eq!(field(&c, "echoed"), 1_000_000, "{c}");
    assert_eq!(field(&s, "echoed"), 1_000_000, "{s}");
}

#[test]
fn batches_of_200_through_16_slots_read_credits_and_wrap() {
    let (c, s) = pair(4096, &["batches", "100000", "200"]);
    assert_eq!(field(&c, "echoed"), 100_000, "{c}");
    // 100,000 messages through 16 slots lap the ring 6,250 times; every lap needs credits.
    assert!(field(&c, "credit_reads") >= 100_000 / 16, "{c}");
    assert!(
        field(&s, "credit_reads") > 0,
        "replies fill the client's ring too: {s}"
    );
}

#[test]
fn fragmented_8_kib_messages() {
    let (c, _) = pair(4096, &["fragmented", "500", "8192"]);
    // 8192 bytes in 191-byte fragments: 43 per message.
    assert_eq!(field(&c, "echoed"), 500 * 43, "{c}");
}
