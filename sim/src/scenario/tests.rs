use super::*;

const GOOD: &str = "seed: 7
duration_sec: 1800
fabric:
  tors: 16
  spines: 4
  hosts_per_tor: 4
  rnics_per_host: 2
  rail_optimized: false
  link_latency_us: 2.0
  link_jitter_us: 0.3
faults:
  - {kind: rnic_down,    location: h3-2/r1,     start_sec: 300, end_sec: 900}
  - {kind: rnic_flap,    location: h5-1/r0,     start_sec: 300, end_sec: 900, period_sec: 20, down_fraction: 0.3}
  - {kind: host_stall,   location: h7-4,        start_sec: 300, end_sec: 900, delay_us: 5000}
  - {kind: tor_down,     location: tor9,        start_sec: 300, end_sec: 900}
  - {kind: link_loss,    location: tor2-spine3, start_sec: 300, end_sec: 900, loss: 0.05, direction: up}
  - {kind: link_down,    location: tor4-spine1, start_sec: 300, end_sec: 900}
  - {kind: link_latency, location: tor6-spine2, start_sec: 300, end_sec: 900, add_us: 200, direction: both}
";

#[test]
fn the_issue_example_parses() {
    let s = Scenario::from_yaml(GOOD).unwrap();
    assert_eq!(s.seed, 7);
    assert_eq!(s.duration_sec, 1800);
    assert_eq!(
        s.fabric,
        FabricSpec {
            tors: 16,
            spines: 4,
            hosts_per_tor: 4,
            rnics_per_host: 2,
            rail_optimized: false,
            link_latency_us: 2.0,
            link_jitter_us: 0.3,
        }
    );
    assert_eq!(s.faults.len(), 7);
    assert_eq!(
        s.faults[1].kind,
        FaultKind::RnicFlap {
            period_sec: 20.0,
            down_fraction: 0.3
        }
    );
    assert_eq!(
        s.faults[4].kind,
        FaultKind::LinkLoss {
            loss: 0.05,
            direction: Direction::Up
        }
    );
    let truth: Vec<_> = s
        .faults
        .iter()
        .map(|f| {
            let g = ground_truth(f);
            format!("{} {}", g.kind, g.location)
        })
        .collect();
    assert_eq!(
        truth,
        [
            "rnic h3-2/r1",
            "rnic h5-1/r0",
            "host h7-4",
            "tor tor9",
            "link tor2-spine3",
            "link tor4-spine1",
            "link tor6-spine2"
        ]
    );
    // The shipped example is the same file.
    let shipped = include_str!("../../scenarios/example.yaml");
    assert_eq!(Scenario::from_yaml(shipped).unwrap(), s);
}

#[test]
fn faults_may_be_empty_or_absent_and_direction_defaults_to_both() {
    let base = "seed: 1\nduration_sec: 60\nfabric: {tors: 2, spines: 2, hosts_per_tor: 1, rnics_per_host: 1, link_latency_us: 1, link_jitter_us: 0}\n";
    assert!(Scenario::from_yaml(base).unwrap().faults.is_empty());
    let empty = format!("{base}faults: []\n");
    assert!(Scenario::from_yaml(&empty).unwrap().faults.is_empty());
    let null = format!("{base}faults:\n");
    assert!(Scenario::from_yaml(&null).unwrap().faults.is_empty());
    let f = format!(
        "{base}faults:\n  - {{kind: link_loss, location: tor1-spine2, start_sec: 1, end_sec: 2, loss: 1}}\n"
    );
    let s = Scenario::from_yaml(&f).unwrap();
    assert_eq!(
        s.faults[0].kind,
        FaultKind::LinkLoss {
            loss: 1.0,
            direction: Direction::Both
        }
    );
    assert!(!s.fabric.rail_optimized);
}

/// The example with one line replaced (by its prefix) or, with `None`, appended.
fn edit(line_prefix: Option<&str>, new: &str) -> String {
    match line_prefix {
        None => format!("{GOOD}{new}\n"),
        Some(p) => {
            let mut hit = false;
            let out: Vec<String> = GOOD
                .lines()
                .map(|l| {
                    if !hit && l.trim_start().starts_with(p) {
                        hit = true;
                        new.to_string()
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            assert!(hit, "no line starts with {p:?}");
            out.join("\n") + "\n"
        }
    }
}

fn fault(body: &str) -> String {
    edit(None, &format!("  - {{{body}}}"))
}

#[test]
fn every_bad_file_gets_one_line_naming_the_field() {
    let cases: Vec<(String, &str)> = vec![
        // Unparsable YAML, wrong shapes.
        ("seed: [\n".into(), "scenario: "),
        ("- 1\n".into(), "scenario: "),
        ("".into(), "scenario: the file is empty"),
        ("# only a comment\n\n".into(), "scenario: the file is empty"),
        // Unknown keys at every level.
        (edit(Some("seed:"), "seed: 7\nextra: 1"), "unknown field `extra`"),
        (
            edit(Some("tors:"), "  tors: 16\n  leaves: 3"),
            "fabric: unknown field `leaves`",
        ),
        (
            fault("kind: tor_down, location: tor1, start_sec: 1, end_sec: 2, colour: red"),
            "faults[7] (tor_down): unknown field `colour`",
        ),
        // Missing top-level fields.
        (edit(Some("seed:"), ""), "seed is missing"),
        (edit(Some("duration_sec:"), ""), "duration_sec is missing"),
        (
            "seed: 1\nduration_sec: 10\n".into(),
            "fabric is missing",
        ),
        (edit(Some("spines:"), ""), "fabric.spines is missing"),
        (edit(Some("link_jitter_us:"), ""), "fabric.link_jitter_us is missing"),
        // Bad values.
        (edit(Some("seed:"), "seed: -3"), "seed must be a whole number >= 0, got -3"),
        (edit(Some("duration_sec:"), "duration_sec: 0"), "duration_sec must be > 0"),
        (
            edit(Some("duration_sec:"), "duration_sec: ten"),
            "duration_sec must be a whole number >= 0, got \"ten\"",
        ),
        (edit(Some("tors:"), "  tors: 0"), "fabric.tors must be > 0"),
        (edit(Some("spines:"), "  spines: 0"), "fabric.spines must be > 0"),
        (
            edit(Some("hosts_per_tor:"), "  hosts_per_tor: 0"),
            "fabric.hosts_per_tor must be > 0",
        ),
        (
            edit(Some("hosts_per_tor:"), "  hosts_per_tor: 2.5"),
            "fabric.hosts_per_tor must be a whole number >= 0, got 2.5",
        ),
        (
            edit(Some("rnics_per_host:"), "  rnics_per_host: 0"),
            "fabric.rnics_per_host must be in 1..=8, got 0",
        ),
        (
            edit(Some("rnics_per_host:"), "  rnics_per_host: 9"),
            "fabric.rnics_per_host must be in 1..=8, got 9",
        ),
        (
            edit(Some("link_latency_us:"), "  link_latency_us: -1"),
            "fabric.link_latency_us must be a finite number >= 0, got -1",
        ),
        (
            edit(Some("link_latency_us:"), "  link_latency_us: .nan"),
            "fabric.link_latency_us must be a finite number >= 0, got \".nan\"",
        ),
        (
            edit(Some("link_jitter_us:"), "  link_jitter_us: -0.5"),
            "fabric.link_jitter_us must be a finite number >= 0, got -0.5",
        ),
        (
            edit(Some("link_jitter_us:"), "  link_jitter_us: .inf"),
            "fabric.link_jitter_us must be a finite number >= 0, got \".inf\"",
        ),
        (
            edit(Some("rail_optimized:"), "  rail_optimized: yes please"),
            "fabric.rail_optimized must be true or false",
        ),
        (
            edit(Some("tors:"), "  tors: 15").replace("rail_optimized: false", "rail_optimized: true"),
            "fabric.rail_optimized: tors (15) must be a multiple of rnics_per_host (2)",
        ),
        ("seed: 1\nduration_sec: 5\nfabric: 3\n".into(), "fabric must be a mapping"),
        (
            format!("{}faults: 3\n", &GOOD[..GOOD.find("faults:").unwrap()]),
            "faults must be a list of faults, got 3",
        ),
        // Faults: kind.
        (fault("location: tor1, start_sec: 1, end_sec: 2"), "faults[7]: kind is missing"),
        (
            fault("kind: meteor, location: tor1, start_sec: 1, end_sec: 2"),
            "faults[7]: unknown kind `meteor` (known: rnic_down, rnic_flap",
        ),
        (fault("kind: 3, location: tor1, start_sec: 1, end_sec: 2"), "faults[7]: kind must be a string"),
        (edit(None, "  - 5"), "faults[7] must be a mapping"),
        // Faults: locations of the wrong form, or not in the fabric.
        (
            fault("kind: rnic_down, location: h3-2, start_sec: 1, end_sec: 2"),
            "faults[7] (rnic_down): location `h3-2` is a host, not an RNIC: expected h<t>-<i>/r<j>",
        ),
        (
            fault("kind: rnic_flap, location: tor1, start_sec: 1, end_sec: 2, period_sec: 5, down_fraction: 0.5"),
            "faults[7] (rnic_flap): location `tor1` is a ToR, not an RNIC",
        ),
        (
            fault("kind: host_stall, location: h1-1/r0, start_sec: 1, end_sec: 2, delay_us: 5"),
            "faults[7] (host_stall): location `h1-1/r0` is an RNIC, not a host",
        ),
        (
            fault("kind: tor_down, location: tor1-spine1, start_sec: 1, end_sec: 2"),
            "faults[7] (tor_down): location `tor1-spine1` is a ToR-spine link, not a ToR",
        ),
        (
            fault("kind: link_down, location: tor1, start_sec: 1, end_sec: 2"),
            "faults[7] (link_down): location `tor1` is a ToR, not a ToR-spine link",
        ),
        (
            fault("kind: link_down, location: spine1-tor1, start_sec: 1, end_sec: 2"),
            "faults[7] (link_down): location `spine1-tor1` is not a ToR-spine link: expected tor<t>-spine<s>",
        ),
        (
            fault("kind: rnic_down, location: h3-9/r0, start_sec: 1, end_sec: 2"),
            "faults[7] (rnic_down): location `h3-9/r0` is not in the fabric: hosts are h1-1..h16-4",
        ),
        (
            fault("kind: rnic_down, location: h3-1/r2, start_sec: 1, end_sec: 2"),
            "faults[7] (rnic_down): location `h3-1/r2` is not in the fabric: devices are r0..r1",
        ),
        (
            fault("kind: host_stall, location: h17-1, start_sec: 1, end_sec: 2, delay_us: 5"),
            "faults[7] (host_stall): location `h17-1` is not in the fabric: hosts are h1-1..h16-4",
        ),
        (
            fault("kind: tor_down, location: tor17, start_sec: 1, end_sec: 2"),
            "faults[7] (tor_down): location `tor17` is not in the fabric: ToRs are tor1..tor16",
        ),
        (
            fault("kind: tor_down, location: tor0, start_sec: 1, end_sec: 2"),
            "location `tor0` is not in the fabric",
        ),
        (
            fault("kind: link_loss, location: tor1-spine5, start_sec: 1, end_sec: 2, loss: 0.1"),
            "faults[7] (link_loss): location `tor1-spine5` is not in the fabric: spines are spine1..spine4",
        ),
        (
            fault("kind: link_loss, location: tor01-spine1, start_sec: 1, end_sec: 2, loss: 0.1"),
            "location `tor01-spine1` is not a ToR-spine link",
        ),
        (
            fault("kind: tor_down, location: 7, start_sec: 1, end_sec: 2"),
            "faults[7] (tor_down): location must be a string, got 7",
        ),
        (fault("kind: tor_down, start_sec: 1, end_sec: 2"), "faults[7] (tor_down): location is missing"),
        // Faults: schedule.
        (fault("kind: tor_down, location: tor1, end_sec: 2"), "faults[7] (tor_down): start_sec is missing"),
        (fault("kind: tor_down, location: tor1, start_sec: 2"), "faults[7] (tor_down): end_sec is missing"),
        (
            fault("kind: tor_down, location: tor1, start_sec: 20, end_sec: 20"),
            "faults[7] (tor_down): end_sec (20) must be after start_sec (20)",
        ),
        (
            fault("kind: tor_down, location: tor1, start_sec: 20, end_sec: 10"),
            "faults[7] (tor_down): end_sec (10) must be after start_sec (20)",
        ),
        (
            fault("kind: tor_down, location: tor1, start_sec: -5, end_sec: 10"),
            "faults[7] (tor_down): start_sec must be a number >= 0, got -5",
        ),
        (
            fault("kind: tor_down, location: tor1, start_sec: soon, end_sec: 10"),
            "faults[7] (tor_down): start_sec must be a number, got \"soon\"",
        ),
        (
            fault("kind: tor_down, location: tor1, start_sec: 100, end_sec: 1801"),
            "faults[7] (tor_down): end_sec (1801) is beyond duration_sec (1800)",
        ),
        (
            fault("kind: tor_down, location: tor1, start_sec: 1800, end_sec: 1900"),
            "faults[7] (tor_down): start_sec (1800) is beyond duration_sec (1800)",
        ),
        // Faults: per-kind fields missing, invalid, or of another kind.
        (
            fault("kind: rnic_flap, location: h1-1/r0, start_sec: 1, end_sec: 2, down_fraction: 0.5"),
            "faults[7] (rnic_flap): period_sec is missing",
        ),
        (
            fault("kind: rnic_flap, location: h1-1/r0, start_sec: 1, end_sec: 2, period_sec: 0, down_fraction: 0.5"),
            "faults[7] (rnic_flap): period_sec must be > 0, got 0",
        ),
        (
            fault("kind: rnic_flap, location: h1-1/r0, start_sec: 1, end_sec: 2, period_sec: 5"),
            "faults[7] (rnic_flap): down_fraction is missing",
        ),
        (
            fault("kind: rnic_flap, location: h1-1/r0, start_sec: 1, end_sec: 2, period_sec: 5, down_fraction: 1"),
            "faults[7] (rnic_flap): down_fraction must be in (0, 1), got 1",
        ),
        (
            fault("kind: rnic_flap, location: h1-1/r0, start_sec: 1, end_sec: 2, period_sec: 5, down_fraction: 0"),
            "faults[7] (rnic_flap): down_fraction must be in (0, 1), got 0",
        ),
        (
            fault("kind: host_stall, location: h1-1, start_sec: 1, end_sec: 2"),
            "faults[7] (host_stall): delay_us is missing",
        ),
        (
            fault("kind: host_stall, location: h1-1, start_sec: 1, end_sec: 2, delay_us: 0"),
            "faults[7] (host_stall): delay_us must be > 0, got 0",
        ),
        (
            fault("kind: host_stall, location: h1-1, start_sec: 1, end_sec: 2, delay_us: lots"),
            "faults[7] (host_stall): delay_us must be a number, got \"lots\"",
        ),
        (
            fault("kind: link_loss, location: tor1-spine1, start_sec: 1, end_sec: 2"),
            "faults[7] (link_loss): loss is missing",
        ),
        (
            fault("kind: link_loss, location: tor1-spine1, start_sec: 1, end_sec: 2, loss: 1.5"),
            "faults[7] (link_loss): loss must be in (0, 1], got 1.5",
        ),
        (
            fault("kind: link_loss, location: tor1-spine1, start_sec: 1, end_sec: 2, loss: 0"),
            "faults[7] (link_loss): loss must be in (0, 1], got 0",
        ),
        (
            fault("kind: link_loss, location: tor1-spine1, start_sec: 1, end_sec: 2, loss: 0.1, direction: sideways"),
            "faults[7] (link_loss): direction must be up, down or both, got \"sideways\"",
        ),
        (
            fault("kind: link_latency, location: tor1-spine1, start_sec: 1, end_sec: 2"),
            "faults[7] (link_latency): add_us is missing",
        ),
        (
            fault("kind: link_latency, location: tor1-spine1, start_sec: 1, end_sec: 2, add_us: -4"),
            "faults[7] (link_latency): add_us must be > 0, got -4",
        ),
        (
            fault("kind: rnic_down, location: h1-1/r0, start_sec: 1, end_sec: 2, loss: 0.5"),
            "faults[7] (rnic_down): field `loss` does not belong to rnic_down (its fields: location, start_sec, end_sec)",
        ),
        (
            fault("kind: link_down, location: tor1-spine1, start_sec: 1, end_sec: 2, direction: up"),
            "faults[7] (link_down): field `direction` does not belong to link_down",
        ),
        (
            fault("kind: host_stall, location: h1-1, start_sec: 1, end_sec: 2, delay_us: 5, add_us: 3"),
            "faults[7] (host_stall): field `add_us` does not belong to host_stall (its fields: location, start_sec, end_sec, delay_us)",
        ),
        (
            fault("kind: link_latency, location: tor1-spine1, start_sec: 1, end_sec: 2, add_us: 5, period_sec: 3"),
            "faults[7] (link_latency): field `period_sec` does not belong to link_latency",
        ),
    ];
    for (text, want) in &cases {
        let e = Scenario::from_yaml(text)
            .expect_err(&format!("must fail ({want}):\n{text}"))
            .to_string();
        assert!(e.contains(want), "want {want:?}\n got {e:?}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[test]
fn code_built_scenarios_get_the_same_checks() {
    let mut s = Scenario::from_yaml(GOOD).unwrap();
    s.faults[4].kind = FaultKind::LinkLoss {
        loss: f64::NAN,
        direction: Direction::Up,
    };
    assert_eq!(
        s.validate().unwrap_err().to_string(),
        "faults[4] (link_loss): loss must be in (0, 1], got NaN"
    );
    s.faults[4].kind = FaultKind::LinkLoss {
        loss: 0.5,
        direction: Direction::Up,
    };
    s.fabric.link_jitter_us = f64::NAN;
    assert_eq!(
        s.validate().unwrap_err().to_string(),
        "fabric.link_jitter_us must be a finite number >= 0, got NaN"
    );
    s.fabric.link_jitter_us = 0.1;
    s.faults[0].location = "h3-2".into();
    assert!(s
        .validate()
        .unwrap_err()
        .to_string()
        .starts_with("faults[0] (rnic_down): location `h3-2` is a host, not an RNIC"));
    s.faults[0].location = "h3-2/r1".into();
    s.fabric.tors = 0;
    assert_eq!(
        s.validate().unwrap_err().to_string(),
        "fabric.tors must be > 0"
    );
    s.fabric.tors = 16;
    assert!(s.validate().is_ok());
}

#[test]
fn rail_locations_use_group_numbers() {
    let text = "seed: 1\nduration_sec: 60\nfabric: {tors: 4, spines: 1, hosts_per_tor: 2, rnics_per_host: 2, rail_optimized: true, link_latency_us: 1, link_jitter_us: 0}\nfaults:\n  - {kind: rnic_down, location: h3-1/r0, start_sec: 1, end_sec: 2}\n";
    // 4 ToRs in rails of 2: host groups 1..2 only.
    let e = Scenario::from_yaml(text).unwrap_err().to_string();
    assert!(e.contains("hosts are h1-1..h2-2"), "{e}");
    assert!(Scenario::from_yaml(&text.replace("h3-1", "h2-2")).is_ok());
}
