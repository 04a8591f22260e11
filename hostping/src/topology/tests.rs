use super::*;
use crate::synth::{build, HostSpec};
use crate::sysfs::{RealSysfs, Recorder, Recording};

fn fixture(name: &str) -> Recording {
    let path = format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Recording::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn downgraded_spec() -> HostSpec {
    // Device 4 is RNIC mlx5_1 (socket 0, second switch): trained x8. Device 8 is a GPU on
    // socket 1: trained at Gen3.
    HostSpec {
        downgrades: vec![(4, 4, 8), (8, 3, 16)],
        ..HostSpec::figure2()
    }
}

/// The fixtures built from a spec are committed so a reader can see the tree; they must
/// be what the builder makes (HOSTPING_BLESS=1 rewrites them).
#[test]
fn built_fixtures_match_their_builders() {
    for (name, spec) in [
        ("figure2.sysfs", HostSpec::figure2()),
        ("figure2-downgraded.sysfs", downgraded_spec()),
    ] {
        let text = build(&spec).to_text();
        let path = format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os("HOSTPING_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        assert_eq!(
            std::fs::read_to_string(&path).unwrap_or_default(),
            text,
            "{name} is stale: HOSTPING_BLESS=1 cargo test -p rpingmesh-hostping"
        );
    }
}

#[test]
fn the_papers_figure2_host_is_read_whole() {
    let t = HostTopology::discover(&fixture("figure2.sysfs")).unwrap();
    assert_eq!(t.numa_nodes.len(), 2);
    assert_eq!(
        t.numa_nodes.iter().map(|n| n.socket).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(t.numa_nodes[0].mem_total_kib, Some(263856128));
    assert_eq!(t.rnics.len(), 4);
    assert_eq!(t.gpus.len(), 8);
    let count = |role| t.pci.iter().filter(|d| d.role == role).count();
    assert_eq!(
        (
            count(PciRole::RootPort),
            count(PciRole::SwitchUpstream),
            count(PciRole::SwitchDownstream)
        ),
        (4, 4, 12)
    );
    for r in &t.rnics {
        let i = r.pci.unwrap();
        assert_eq!(t.pci[i].role, PciRole::Rnic);
        assert_eq!(r.ports[0].rate_gbps, Some(200.0));
        assert_eq!(r.netdevs.len(), 1);
        // RNIC -> downstream port -> switch -> root port.
        let chain: Vec<PciRole> = t.ancestry(i).iter().map(|&j| t.pci[j].role).collect();
        assert_eq!(
            chain,
            vec![
                PciRole::Rnic,
                PciRole::SwitchDownstream,
                PciRole::SwitchUpstream,
                PciRole::RootPort
            ]
        );
    }
    assert_eq!(t.socket_of_pci(t.rnics[3].pci.unwrap()), Some(1));
    assert!(t.downgrades().is_empty());
    let tree = t.render(&|_| None);
    assert!(tree.contains("socket 1"), "{tree}");
    assert!(
        tree.contains("rnic mlx5_2 (mlx5_2 netdev ens2np0 port 1 ACTIVE 200 Gb/s)"),
        "{tree}"
    );
    assert!(tree.contains("link 16 GT/s x16"), "{tree}");
    assert!(tree.contains("socket interconnect 0 <-> 1"), "{tree}");
}

#[test]
fn a_link_trained_below_both_ends_is_named() {
    let t = HostTopology::discover(&fixture("figure2-downgraded.sysfs")).unwrap();
    let d = t.downgrades();
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0].what, "rnic mlx5_1");
    assert_eq!(
        (d[0].current.width, d[0].capable.width),
        (Some(8), Some(16))
    );
    assert_eq!(d[1].what, "gpu");
    assert_eq!(
        (d[1].current.speed_gts, d[1].capable.speed_gts),
        (Some(8.0), Some(16.0))
    );
    let line = d[0].describe();
    assert!(
        line.contains("16 GT/s x8 of 16 GT/s x16 (126 of 252 Gb/s)"),
        "{line}"
    );
    let tree = t.render(&|_| None);
    assert!(
        tree.contains("link 16 GT/s x8 (capable 16 GT/s x16)"),
        "{tree}"
    );
}

#[test]
fn a_fast_card_in_a_slower_slot_is_not_a_downgrade() {
    let mut rec = build(&HostSpec::figure2());
    let t = HostTopology::discover(&rec).unwrap();
    let gpu = &t.pci[t.gpus[0]];
    let parent = &t.pci[gpu.parent.unwrap()].bdf;
    // The switch port above it is Gen3; the Gen4 GPU trained at Gen3 is at its best.
    rec.file(
        &format!("/sys/bus/pci/devices/{parent}/max_link_speed"),
        "8.0 GT/s PCIe\n",
    );
    rec.file(
        &format!("/sys/bus/pci/devices/{}/current_link_speed", gpu.bdf),
        "8.0 GT/s PCIe\n",
    );
    assert!(HostTopology::discover(&rec)
        .unwrap()
        .downgrades()
        .is_empty());
}

fn error_of(edit: impl FnOnce(&mut Recording, &HostTopology)) -> TopologyError {
    let mut rec = build(&HostSpec::figure2());
    let t = HostTopology::discover(&rec).unwrap();
    edit(&mut rec, &t);
    HostTopology::discover(&rec).unwrap_err()
}

#[test]
fn malformed_trees_get_one_clear_error_naming_the_file() {
    let e = error_of(|r, t| {
        r.file(
            &format!(
                "/sys/bus/pci/devices/{}/current_link_speed",
                t.pci[t.gpus[0]].bdf
            ),
            "fast\n",
        );
    });
    assert!(
        e.path.ends_with("current_link_speed") && e.reason.contains("expected a link speed"),
        "{e}"
    );

    let e = error_of(|r, t| {
        r.file(
            &format!(
                "/sys/bus/pci/devices/{}/max_link_width",
                t.pci[t.gpus[0]].bdf
            ),
            "sixteen\n",
        );
    });
    assert!(e.reason.contains("link width"), "{e}");

    let e = error_of(|r, t| {
        r.file(
            &format!("/sys/bus/pci/devices/{}/class", t.pci[t.gpus[0]].bdf),
            "gpu\n",
        );
    });
    assert!(
        e.path.ends_with("/class") && e.reason.contains("hex"),
        "{e}"
    );

    let e = error_of(|r, t| {
        r.link(
            &format!("/sys/bus/pci/devices/{}", t.pci[t.gpus[0]].bdf),
            "../../../devices/platform/foo",
        );
    });
    assert!(e.reason.contains("no pci<domain>:<bus> host bridge"), "{e}");

    let e = error_of(|r, t| {
        let gpu = &t.pci[t.gpus[0]];
        let parent = t.pci[gpu.parent.unwrap()].bdf.clone();
        let list: Vec<String> = t
            .pci
            .iter()
            .map(|d| d.bdf.clone())
            .filter(|b| *b != parent)
            .collect();
        let names: Vec<&str> = list.iter().map(String::as_str).collect();
        r.dir("/sys/bus/pci/devices", &names);
    });
    assert!(e.reason.contains("is not in /sys/bus/pci/devices"), "{e}");

    let e = error_of(|r, _| {
        r.link(
            "/sys/class/infiniband/mlx5_0",
            "../../devices/pci0000:10/0000:10:00.0/0000:77:00.0/infiniband/mlx5_0",
        );
    });
    assert!(
        e.path == "/sys/class/infiniband/mlx5_0" && e.reason.contains("0000:77:00.0"),
        "{e}"
    );

    let e = error_of(|r, _| {
        r.file(
            "/sys/devices/system/node/node1/meminfo",
            "Node 1 MemFree: 5 kB\n",
        );
    });
    assert!(e.reason.contains("no MemTotal"), "{e}");

    let e = error_of(|r, _| {
        r.file("/sys/devices/system/node/node0/cpulist", "zero\n");
    });
    assert!(e.reason.contains("CPU list"), "{e}");

    let e = error_of(|r, _| {
        r.dir_add("/sys/bus/pci/devices", "not-an-address");
    });
    assert!(e.reason.contains("not a PCI address"), "{e}");
}

#[test]
fn an_empty_or_absent_tree_is_a_host_with_nothing_on_it() {
    let t = HostTopology::discover(&Recording::default()).unwrap();
    assert_eq!((t.numa_nodes.len(), t.rnics.len(), t.pci.len()), (1, 0, 0));
}

/// This machine (no RDMA devices, virtio PCI): discovery runs on the live sysfs, and its
/// recording reads back to the same tree.
#[test]
fn this_machine_is_read_and_its_recording_replays() {
    let rec = Recorder::new(RealSysfs::host());
    let live = HostTopology::discover(&rec).unwrap();
    assert!(!live.numa_nodes.is_empty());
    let again =
        HostTopology::discover(&Recording::parse(&rec.recording().to_text()).unwrap()).unwrap();
    assert_eq!(again, live);
}

/// A recording of a machine of this project's kind, taken with
/// `rpingmesh-agent hostping --record`.
#[test]
fn the_recorded_build_machine_reads_back() {
    let t = HostTopology::discover(&fixture("build-machine.sysfs")).unwrap();
    assert!(!t.numa_nodes.is_empty());
    assert!(t.rnics.is_empty());
}

/// Recorded in the soft-RoCE VM by the hostping scenario (`--record`): four rxe devices
/// on veths, virtual (no PCI function), each naming its netdev in `parent`.
#[test]
fn the_recorded_soft_roce_guest_reads_back_with_virtual_rnics() {
    let rec = fixture("vm-rxe.sysfs");
    let t = HostTopology::discover(&rec).unwrap();
    let names: Vec<&str> = t.rnics.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["rxeh0", "rxeh1", "rxeh2", "rxeh3"]);
    for (i, r) in t.rnics.iter().enumerate() {
        assert_eq!(r.pci, None);
        assert_eq!(r.netdevs, vec![format!("vh{i}")]);
        assert_eq!(
            (r.ports[0].state.as_str(), r.ports[0].rate_gbps),
            ("ACTIVE", Some(10.0))
        );
    }
    assert!(t.downgrades().is_empty());
    let tree = t.render(&|_| None);
    assert!(
        tree.contains("virtual RDMA devices\n  rxeh0 netdev vh0 port 1 ACTIVE 10 Gb/s"),
        "{tree}"
    );
    // rxe keeps driver counters only (no IB port counters): read, with no throughput.
    let c = crate::hwmon::read_port(&rec, "rxeh0", 1);
    assert!(
        c.counters.contains_key("sent_pkts") && !c.counters.contains_key("port_xmit_data"),
        "{c:?}"
    );
}
