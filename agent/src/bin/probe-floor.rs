//! probe-floor: the footprint bench's baseline. It sends the measured agent's traffic
//! (one probe to each target per round, the whole round in one burst, as the agent's
//! scheduler does) through the same udp transport, and reads the ACKs and TX timestamps
//! back, with nothing else: no prober state, no aggregation, no controller, no tracer,
//! one thread. Its CPU is what the kernel and the transport charge for the datagrams
//! alone, so `agent CPU / floor CPU` in one run is the agent's own overhead.
//!
//! usage: probe-floor BIND_ADDR ROUND_MS TARGET_ADDR...
//! Every second it prints `floor sent=N acks=M` on stderr (the bench checks the ACKs).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rpingmesh_agent_common::wire::ProbePacket;
use rpingmesh_verbs::udp::{endpoint_of, UdpEndpoint};
use rpingmesh_verbs::{Endpoint, SendParams, TransportEvent};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        bail!("usage: probe-floor BIND_ADDR ROUND_MS TARGET_ADDR...");
    }
    let bind: SocketAddr = args[0].parse().context("BIND_ADDR")?;
    let round = Duration::from_millis(args[1].parse().context("ROUND_MS")?);
    let targets = args[2..]
        .iter()
        .map(|a| a.parse::<SocketAddr>().map(|a| endpoint_of(&a)))
        .collect::<Result<Vec<_>, _>>()
        .context("TARGET_ADDR")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(bind, round, targets))
}

async fn run(bind: SocketAddr, round: Duration, targets: Vec<Endpoint>) -> Result<()> {
    let ep = UdpEndpoint::bind(bind, "floor0")?;
    let params = SendParams::default();
    let mut events = Vec::with_capacity(256);
    let mut next_round = tokio::time::Instant::now();
    let mut next_report = next_round + Duration::from_secs(1);
    let (mut sequence, mut sent, mut acks) = (0u64, 0u64, 0u64);
    loop {
        tokio::select! {
            r = ep.wait_events(&mut events) => {
                r.context("receiving")?;
            }
            _ = tokio::time::sleep_until(next_round) => {
                for to in &targets {
                    let t1 = rpingmesh_verbs::clock::monotonic_ns();
                    let pkt = ProbePacket::probe(sequence, t1).encode();
                    sequence += 1;
                    if ep.send(to, &params, &pkt).is_ok() {
                        sent += 1;
                    }
                }
                // As the agent does after a burst: the TX timestamps are queued already.
                ep.poll_completions(&mut events)?;
                next_round += round;
            }
        }
        acks += events
            .drain(..)
            .filter(|e| matches!(e, TransportEvent::Received { .. }))
            .count() as u64;
        if tokio::time::Instant::now() >= next_report {
            eprintln!("floor sent={sent} acks={acks}");
            next_report += Duration::from_secs(1);
        }
    }
}
