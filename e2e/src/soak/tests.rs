//! Tests of `soak.rs`.

use super::*;

#[test]
fn utc_timestamps_parse() {
    assert_eq!(parse_utc_ns("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(
        parse_utc_ns("2026-12-01T14:59:06.876818Z"),
        Some(1_796_137_146_876_818_000)
    );
    assert_eq!(
        parse_utc_ns("2000-03-01T00:00:01.5Z"),
        Some(951_868_801_500_000_000)
    );
    assert_eq!(parse_utc_ns("garbage"), None);
}

#[test]
fn target_count_lines_are_read() {
    let log = r#"{"timestamp":"1970-01-01T00:00:02Z","level":"DEBUG","fields":{"message":"pinglists refreshed","gid":"g","ok":true,"tor_mesh":3,"inter_tor":0,"service":0},"target":"x"}
{"timestamp":"1970-01-01T00:00:04Z","level":"DEBUG","fields":{"message":"pinglists refreshed","gid":"g","ok":false,"tor_mesh":3,"inter_tor":0,"service":0},"target":"x"}
not json
{"timestamp":"1970-01-01T00:00:03Z","level":"INFO","fields":{"message":"other"}}"#;
    assert_eq!(target_counts(log), vec![(2_000_000_000, 3)]);
}
