//! Sysfs trees of hosts described in a few lines: the hosts of the tests (the paper's
//! Figure 2 server, its downgraded twin) and the randomized hosts of the accuracy suite.
//! What they produce is a [`Recording`] laid out as the kernel lays out sysfs, so it goes
//! through the same discovery as a live host.

use crate::sysfs::Recording;

/// A PCIe generation's speed, GT/s.
pub fn gen_speed(gen: u32) -> f64 {
    match gen {
        1 => 2.5,
        2 => 5.0,
        3 => 8.0,
        4 => 16.0,
        5 => 32.0,
        _ => 64.0,
    }
}

fn speed_text(gts: f64) -> String {
    format!("{gts:.1} GT/s PCIe")
}

/// A device under a root port (behind the switch, when there is one).
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceSpec {
    /// An RNIC at `gbps` line rate.
    Rnic {
        gbps: u32,
    },
    Gpu,
}

/// One root port: a switch under it or not, and its devices.
#[derive(Debug, Clone, PartialEq)]
pub struct RootPortSpec {
    pub switch: bool,
    pub devices: Vec<DeviceSpec>,
}

/// A host: per socket, its root ports. One NUMA node per socket.
#[derive(Debug, Clone, PartialEq)]
pub struct HostSpec {
    pub sockets: Vec<Vec<RootPortSpec>>,
    /// Links of every device and port: generation and width.
    pub gen: u32,
    pub width: u32,
    /// (device index in creation order: RNICs and GPUs, counted across the host,
    /// trained generation, trained width): a link trained below its best.
    pub downgrades: Vec<(usize, u32, u32)>,
}

impl HostSpec {
    /// The paper's Figure 2: two sockets joined by UPI, each with two root ports, each
    /// with a PCIe switch holding two A100 GPUs and one 200 Gb/s CX6-DX RNIC.
    pub fn figure2() -> Self {
        let rp = RootPortSpec {
            switch: true,
            devices: vec![
                DeviceSpec::Gpu,
                DeviceSpec::Rnic { gbps: 200 },
                DeviceSpec::Gpu,
            ],
        };
        HostSpec {
            sockets: vec![vec![rp.clone(), rp.clone()], vec![rp.clone(), rp]],
            gen: 4,
            width: 16,
            downgrades: Vec::new(),
        }
    }
}

/// Names the builder gives: RNIC `k` is `mlx5_<k>` with netdev `ens<k>np0`.
pub fn rnic_name(k: usize) -> String {
    format!("mlx5_{k}")
}

struct Builder {
    rec: Recording,
}

impl Builder {
    fn pci_fn(
        &mut self,
        rc: &str,
        chain: &[String],
        (class, vendor, device): (u32, u32, u32),
        node: u32,
        (cur, max): ((f64, u32), (f64, u32)),
    ) {
        let bdf = chain.last().expect("a chain ends in its device");
        let dev_dir = format!("/sys/bus/pci/devices/{bdf}");
        self.rec.link(
            &dev_dir,
            &format!("../../../devices/{rc}/{}", chain.join("/")),
        );
        self.rec.dir_add("/sys/bus/pci/devices", bdf);
        self.rec
            .file(&format!("{dev_dir}/class"), &format!("0x{class:06x}\n"))
            .file(&format!("{dev_dir}/vendor"), &format!("0x{vendor:04x}\n"))
            .file(&format!("{dev_dir}/device"), &format!("0x{device:04x}\n"))
            .file(&format!("{dev_dir}/numa_node"), &format!("{node}\n"))
            .file(
                &format!("{dev_dir}/current_link_speed"),
                &format!("{}\n", speed_text(cur.0)),
            )
            .file(
                &format!("{dev_dir}/max_link_speed"),
                &format!("{}\n", speed_text(max.0)),
            )
            .file(
                &format!("{dev_dir}/current_link_width"),
                &format!("{}\n", cur.1),
            )
            .file(
                &format!("{dev_dir}/max_link_width"),
                &format!("{}\n", max.1),
            );
    }
}

/// The host's sysfs as the kernel would show it.
pub fn build(spec: &HostSpec) -> Recording {
    let mut b = Builder {
        rec: Recording::default(),
    };
    let best = (gen_speed(spec.gen), spec.width);
    let cpus_per_socket = 32;
    let mut device_no = 0usize;
    let mut rnic_no = 0usize;
    let mut bus = 0x10u32;
    b.rec.dir("/sys/devices/system/node", &[]);
    for (s, root_ports) in spec.sockets.iter().enumerate() {
        let node = s as u32;
        let first = s * cpus_per_socket;
        b.rec
            .dir_add("/sys/devices/system/node", &format!("node{node}"));
        b.rec
            .file(&format!("/sys/devices/system/node/node{node}/cpulist"), &format!("{first}-{}\n", first + cpus_per_socket - 1))
            .file(
                &format!("/sys/devices/system/node/node{node}/meminfo"),
                &format!("Node {node} MemTotal:       263856128 kB\nNode {node} MemFree:        200000000 kB\n"),
            )
            .file(&format!("/sys/devices/system/cpu/cpu{first}/topology/physical_package_id"), &format!("{s}\n"));
        for rp in root_ports {
            // Intel style: one host bridge per root port, the port at <bus>:00.0.
            let rc = format!("pci0000:{bus:02x}");
            let rp_bdf = format!("0000:{bus:02x}:00.0");
            b.pci_fn(
                &rc,
                std::slice::from_ref(&rp_bdf),
                (0x060400, 0x8086, 0x347a),
                node,
                (best, best),
            );
            let mut above = vec![rp_bdf];
            let mut next_bus = bus + 1;
            if rp.switch {
                let usp = format!("0000:{next_bus:02x}:00.0");
                above.push(usp);
                b.pci_fn(&rc, &above, (0x060400, 0x10b5, 0x8747), node, (best, best));
                next_bus += 1;
            }
            let dsp_bus = next_bus;
            for (k, dev) in rp.devices.iter().enumerate() {
                let mut chain = above.clone();
                let dev_bus = if rp.switch {
                    dsp_bus + 1 + k as u32
                } else {
                    next_bus
                };
                if rp.switch {
                    chain.push(format!("0000:{dsp_bus:02x}:{k:02x}.0"));
                    b.pci_fn(&rc, &chain, (0x060400, 0x10b5, 0x8747), node, (best, best));
                }
                let bdf = format!("0000:{dev_bus:02x}:00.0");
                chain.push(bdf.clone());
                let cur = spec
                    .downgrades
                    .iter()
                    .find(|d| d.0 == device_no)
                    .map_or(best, |d| (gen_speed(d.1), d.2));
                match dev {
                    DeviceSpec::Gpu => {
                        b.pci_fn(&rc, &chain, (0x030200, 0x10de, 0x20b2), node, (cur, best))
                    }
                    DeviceSpec::Rnic { gbps } => {
                        b.pci_fn(&rc, &chain, (0x020000, 0x15b3, 0x101d), node, (cur, best));
                        let name = rnic_name(rnic_no);
                        let netdev = format!("ens{rnic_no}np0");
                        b.rec
                            .dir(&format!("/sys/bus/pci/devices/{bdf}/net"), &[&netdev]);
                        let ib = format!("/sys/class/infiniband/{name}");
                        b.rec.link(
                            &ib,
                            &format!("../../devices/{rc}/{}/infiniband/{name}", chain.join("/")),
                        );
                        b.rec.dir_add("/sys/class/infiniband", &name);
                        b.rec.dir(&format!("{ib}/ports"), &["1"]);
                        b.rec
                            .file(&format!("{ib}/ports/1/state"), "4: ACTIVE\n")
                            .file(
                                &format!("{ib}/ports/1/rate"),
                                &format!("{gbps} Gb/sec (2X HDR)\n"),
                            );
                        rnic_no += 1;
                    }
                }
                device_no += 1;
            }
            bus = (dsp_bus + 2 + rp.devices.len() as u32 + 0x0f) & !0x0f;
        }
    }
    if rnic_no == 0 {
        b.rec.dir("/sys/class/infiniband", &[]);
    }
    b.rec
}
