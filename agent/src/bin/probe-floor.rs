//! probe-floor: the footprint bench's baseline. It sends the measured agent's traffic
//! (one probe to each target per round, the whole round in one burst, as the agent's
//! scheduler does) through the same udp transport, and reads the ACKs and TX timestamps
//! back, with nothing else: no prober state, no aggregation, no controller, no tracer,
//! one thread, its round on a timerfd as the agent's driver. Its CPU is what the kernel and the transport charge for the datagrams
//! alone, so `agent CPU / floor CPU` in one run is the agent's own overhead.
//!
//! usage: probe-floor BIND_ADDR ROUND_MS TARGET_ADDR...
//! Every second it prints `floor sent=N acks=M` on stderr (the bench checks the ACKs).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rpingmesh_agent::rnic::DeadlineTimer;
use rpingmesh_agent_common::wire::ProbePacket;
use rpingmesh_verbs::clock::monotonic_ns;
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
    let mut batch = Vec::with_capacity(targets.len());
    let mut results = Vec::with_capacity(targets.len());
    // The agent's driver waits on its own timerfd too (no tokio timer wheel).
    let mut timer = DeadlineTimer::new()?;
    let round_ns = round.as_nanos() as u64;
    let mut next_round = monotonic_ns();
    let mut next_report = next_round + 1_000_000_000;
    let (mut sequence, mut sent, mut acks) = (0u64, 0u64, 0u64);
    loop {
        timer.arm(next_round)?;
        tokio::select! {
            r = ep.wait_events(&mut events) => {
                r.context("receiving")?;
            }
            r = timer.expired() => {
                r.context("round timer")?;
                batch.clear();
                for to in &targets {
                    let t1 = monotonic_ns();
                    batch.push((*to, params, ProbePacket::probe(sequence, t1).encode()));
                    sequence += 1;
                }
                // As the agent's driver: the round in one batch.
                ep.send_batch(&batch, &mut results);
                sent += results.drain(..).filter(|r| r.is_ok()).count() as u64;
                // As the agent does after a burst: the TX timestamps are queued already.
                ep.poll_completions(&mut events)?;
                next_round += round_ns;
            }
        }
        acks += events
            .drain(..)
            .filter(|e| matches!(e, TransportEvent::Received { .. }))
            .count() as u64;
        if monotonic_ns() >= next_report {
            eprintln!("floor sent={sent} acks={acks}");
            next_report += 1_000_000_000;
        }
    }
}
