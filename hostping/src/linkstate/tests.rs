//! Tests of `linkstate.rs`.

use super::*;

fn pv(rnic: &str, ep: &str, links: &[&str], abnormal: bool) -> PathVerdict {
    PathVerdict {
        rnic: rnic.into(),
        endpoint: ep.into(),
        links: links.iter().map(|l| LinkId::Pcie((*l).into())).collect(),
        abnormal,
    }
}

#[test]
fn a_link_only_abnormal_paths_share_is_named_alone() {
    let mut inf = LinkStateInference::new();
    let paths = vec![
        pv("r0", "m0", &["r0", "m0"], false),
        pv("r0", "m1", &["r0", "m1"], true),
        pv("r1", "m1", &["r1", "m1"], true),
        pv("r1", "m0", &["r1", "m0"], false),
    ];
    let r = inf.round(&paths, &BTreeMap::new(), 0.9);
    assert_eq!(r.findings.len(), 1);
    assert_eq!(r.findings[0].link, LinkId::Pcie("m1".into()));
    assert_eq!((r.findings[0].abnormal_cnt, r.findings[0].rnics), (2, 2));
    assert_eq!(r.states[&LinkId::Pcie("r0".into())], LinkState::Normal);
}

#[test]
fn links_no_path_tells_apart_are_alternatives() {
    let mut inf = LinkStateInference::new();
    let paths = vec![
        pv("r0", "g0", &["r0", "sw", "g0"], true),
        pv("r0", "m0", &["r0", "m0"], false),
    ];
    let r = inf.round(&paths, &BTreeMap::new(), 0.9);
    assert_eq!(r.findings.len(), 1);
    assert_eq!(r.findings[0].link, LinkId::Pcie("g0".into()));
    assert_eq!(r.findings[0].alternatives, vec![LinkId::Pcie("sw".into())]);
}

#[test]
fn a_loaded_link_is_congested_not_failed() {
    let mut inf = LinkStateInference::new();
    let paths = vec![
        pv("r0", "m1", &["r0", "upi"], true),
        pv("r0", "m0", &["r0", "m0"], false),
    ];
    let util = BTreeMap::from([(LinkId::Pcie("upi".into()), 0.95)]);
    let r = inf.round(&paths, &util, 0.9);
    assert_eq!(r.findings[0].cause, Cause::Congestion);
    let util = BTreeMap::from([(LinkId::Pcie("upi".into()), 0.5)]);
    assert_eq!(
        inf.round(&paths, &util, 0.9).findings[0].cause,
        Cause::Failure
    );
}

#[test]
fn three_gray_rounds_in_a_row_make_a_link_flapping() {
    let mut inf = LinkStateInference::new();
    // m0 fine for r0, not for r1, whose own link is proven fine elsewhere.
    let gray = vec![
        pv("r0", "m0", &["r0", "m0"], false),
        pv("r1", "m0", &["r1", "m0"], true),
        pv("r1", "m1", &["r1", "m1"], false),
        pv("r2", "m0", &["r2", "m0"], true),
        pv("r2", "m1", &["r2", "m1"], false),
    ];
    let clean: Vec<PathVerdict> = gray
        .iter()
        .map(|p| PathVerdict {
            abnormal: false,
            ..p.clone()
        })
        .collect();
    let r = inf.round(&gray, &BTreeMap::new(), 0.9);
    assert_eq!(r.states[&LinkId::Pcie("m0".into())], LinkState::Gray);
    assert!(r.findings.is_empty());
    assert_eq!(r.states[&LinkId::Pcie("r1".into())], LinkState::Normal);
    inf.round(&gray, &BTreeMap::new(), 0.9);
    inf.round(&clean, &BTreeMap::new(), 0.9); // the streak starts over
    assert!(inf.round(&gray, &BTreeMap::new(), 0.9).findings.is_empty());
    assert!(inf.round(&gray, &BTreeMap::new(), 0.9).findings.is_empty());
    let r = inf.round(&gray, &BTreeMap::new(), 0.9);
    let flapping: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.cause == Cause::Flapping)
        .map(|f| f.link.to_string())
        .collect();
    assert_eq!(flapping, vec!["pcie:m0".to_string()]);
    // Down, up, down is flapping too, even when a round caught it down on every path.
    let mut inf = LinkStateInference::new();
    let all_bad: Vec<PathVerdict> = gray
        .iter()
        .map(|p| PathVerdict {
            abnormal: p.endpoint == "m0",
            ..p.clone()
        })
        .collect();
    let r = inf.round(&all_bad, &BTreeMap::new(), 0.9);
    assert_eq!(
        (r.findings[0].link.to_string(), r.findings[0].cause),
        ("pcie:m0".to_string(), Cause::Failure)
    );
    inf.round(&clean, &BTreeMap::new(), 0.9);
    let r = inf.round(&all_bad, &BTreeMap::new(), 0.9);
    assert_eq!(r.findings[0].cause, Cause::Failure);
    let r = inf.round(&clean, &BTreeMap::new(), 0.9);
    assert_eq!(
        (r.findings.len(), r.findings[0].cause),
        (1, Cause::Flapping)
    );
}

#[test]
fn two_broken_links_are_two_findings() {
    let mut inf = LinkStateInference::new();
    let paths = vec![
        pv("r0", "m0", &["r0", "m0"], true),
        pv("r0", "m1", &["r0", "m1"], true),
        pv("r1", "m0", &["r1", "m0"], false),
        pv("r1", "m1", &["r1", "m1"], false),
        pv("r1", "g", &["r1", "g"], true),
        pv("r2", "g", &["r2", "g"], true),
        pv("r2", "m0", &["r2", "m0"], false),
    ];
    let r = inf.round(&paths, &BTreeMap::new(), 0.9);
    let named: BTreeSet<String> = r.findings.iter().map(|f| f.link.to_string()).collect();
    assert_eq!(
        named,
        BTreeSet::from(["pcie:r0".to_string(), "pcie:g".to_string()])
    );
}
