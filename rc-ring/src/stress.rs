//! Seed 001's validation runs, over any backend: an echo server, and clients that pipeline
//! messages, send them in batches, or send fragmented large messages, checking every echo
//! byte for byte and in order. The shared-memory tests and the soft-RoCE VM run these.

use std::time::{Duration, Instant};

use crate::frag::{fragments, Reassembler};
use crate::MAX_PAYLOAD;

/// One side of a connected ring pair.
pub trait RingLink {
    /// Sends one message; `Ok(false)` when backpressured (call again later).
    fn try_send(&mut self, payload: &[u8]) -> Result<bool, String>;
    fn try_recv(&mut self, out: &mut [u8; MAX_PAYLOAD]) -> Result<Option<usize>, String>;
    /// Called when a loop made no progress: a backend may wait briefly or poll completions.
    fn idle(&mut self) {}
}

/// The server's stop message: echoed, then the server returns.
pub const END: [u8; MAX_PAYLOAD] = [0xEE; MAX_PAYLOAD];

/// Message `i`: 1 to 192 bytes, consecutive bytes differ (never `END`).
pub fn pattern(i: u64, out: &mut [u8; MAX_PAYLOAD]) -> usize {
    let len = 1 + (i.wrapping_mul(2_654_435_761) % MAX_PAYLOAD as u64) as usize;
    for (k, b) in out[..len].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7).wrapping_add(k as u8);
    }
    len
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub sent: u64,
    pub echoed: u64,
    pub backpressured: u64,
}

fn check_deadline(deadline: Instant, what: &str, c: &Counts) -> Result<(), String> {
    if Instant::now() > deadline {
        return Err(format!(
            "{what}: timed out after {} sent, {} echoed",
            c.sent, c.echoed
        ));
    }
    Ok(())
}

/// The server loop: hands each message but `END` to `each` (with its index), echoes `END`
/// and returns how many messages came before it.
fn serve(
    link: &mut dyn RingLink,
    timeout: Duration,
    what: &str,
    mut each: impl FnMut(&mut dyn RingLink, u64, &[u8], Instant) -> Result<(), String>,
) -> Result<u64, String> {
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; MAX_PAYLOAD];
    let mut n = 0u64;
    loop {
        let Some(len) = link.try_recv(&mut buf)? else {
            link.idle();
            if Instant::now() > deadline {
                return Err(format!("{what}: timed out after {n} messages"));
            }
            continue;
        };
        if buf[..len] == END {
            send_until(link, &END, deadline, what, n)?;
            return Ok(n);
        }
        each(link, n, &buf[..len], deadline)?;
        n += 1;
    }
}

/// Sends `msg`, waiting out backpressure until `deadline`.
fn send_until(
    link: &mut dyn RingLink,
    msg: &[u8],
    deadline: Instant,
    what: &str,
    n: u64,
) -> Result<(), String> {
    while !link.try_send(msg)? {
        link.idle();
        if Instant::now() > deadline {
            return Err(format!("{what}: reply blocked after {n} messages"));
        }
    }
    Ok(())
}

/// Receives pattern messages (`run_stream`'s), checking each in order, until `END`, which
/// it echoes. Returns messages received.
pub fn serve_sink(link: &mut dyn RingLink, timeout: Duration) -> Result<u64, String> {
    serve(link, timeout, "sink", |_, n, msg, _| {
        check_pattern(n, msg).map_err(|e| format!("sink: {e}"))
    })
}

/// Offers pattern message number `c.sent`: false when the ring has no credit for it
/// (counted as backpressure).
fn offer_next(
    link: &mut dyn RingLink,
    c: &mut Counts,
    buf: &mut [u8; MAX_PAYLOAD],
) -> Result<bool, String> {
    let len = pattern(c.sent, buf);
    let sent = link.try_send(&buf[..len])?;
    if sent {
        c.sent += 1;
    } else {
        c.backpressured += 1;
    }
    Ok(sent)
}

/// Sends `n` pattern messages one way as fast as credits allow (the sink checks them),
/// then ends the sink.
pub fn run_stream(link: &mut dyn RingLink, n: u64, timeout: Duration) -> Result<Counts, String> {
    let deadline = Instant::now() + timeout;
    let mut c = Counts::default();
    let mut buf = [0u8; MAX_PAYLOAD];
    while c.sent < n {
        if !offer_next(link, &mut c, &mut buf)? {
            link.idle();
            check_deadline(deadline, "stream", &c)?;
        }
    }
    end_server(link, deadline, &c)?;
    Ok(c)
}

/// Echoes every message until `END` (echoed too). Returns messages echoed.
pub fn serve_echo(link: &mut dyn RingLink, timeout: Duration) -> Result<u64, String> {
    serve(link, timeout, "echo server", |link, n, msg, deadline| {
        send_until(link, msg, deadline, "echo server", n)
    })
}

/// Checks echo `i` (the count so far) of a run.
type EchoCheck<'a> = dyn FnMut(u64, &[u8]) -> Result<(), String> + 'a;

/// Receives and checks the echoes that are ready (never more than were sent).
fn drain_echoes(
    link: &mut dyn RingLink,
    c: &mut Counts,
    check: &mut EchoCheck<'_>,
) -> Result<bool, String> {
    let mut buf = [0u8; MAX_PAYLOAD];
    let mut progressed = false;
    while c.echoed < c.sent {
        let Some(len) = link.try_recv(&mut buf)? else {
            break;
        };
        check(c.echoed, &buf[..len])?;
        c.echoed += 1;
        progressed = true;
    }
    Ok(progressed)
}

fn check_pattern(i: u64, got: &[u8]) -> Result<(), String> {
    let mut want = [0u8; MAX_PAYLOAD];
    let len = pattern(i, &mut want);
    if got != &want[..len] {
        return Err(format!(
            "message {i}: {} bytes {:02x?}.. differ from the {len} sent",
            got.len(),
            &got[..got.len().min(8)]
        ));
    }
    Ok(())
}

/// Sends `n` pattern messages, `batch` at a time (each batch fully echoed before the next;
/// `None`: one continuous pipeline), draining echoes whenever the send is backpressured,
/// so neither direction's ring can deadlock the other. Ends the server.
pub fn run_client(
    link: &mut dyn RingLink,
    n: u64,
    batch: Option<u64>,
    timeout: Duration,
) -> Result<Counts, String> {
    let deadline = Instant::now() + timeout;
    let mut c = Counts::default();
    let mut buf = [0u8; MAX_PAYLOAD];
    let mut check = check_pattern;
    while c.echoed < n {
        let batch_end = match batch {
            Some(b) => (c.sent + b).min(n),
            None => n,
        };
        while c.sent < batch_end {
            if !offer_next(link, &mut c, &mut buf)? {
                if !drain_echoes(link, &mut c, &mut check)? {
                    link.idle();
                }
                check_deadline(deadline, "client", &c)?;
            }
        }
        while c.echoed < c.sent {
            if !drain_echoes(link, &mut c, &mut check)? {
                link.idle();
            }
            check_deadline(deadline, "client", &c)?;
        }
    }
    end_server(link, deadline, &c)?;
    Ok(c)
}

/// Sends `n` messages of `size` bytes each, fragmented; reassembles the echoed fragments
/// and checks each whole message.
pub fn run_fragmented(
    link: &mut dyn RingLink,
    n: u64,
    size: usize,
    timeout: Duration,
) -> Result<Counts, String> {
    let deadline = Instant::now() + timeout;
    let mut c = Counts::default();
    let mut r = Reassembler::new(size);
    let mut whole = 0u64;
    let message =
        |i: u64| -> Vec<u8> { (0..size).map(|k| (i as usize * 13 + k * 7) as u8).collect() };
    let mut check = |_: u64, frag: &[u8]| -> Result<(), String> {
        if let Some(m) = r.push(frag).map_err(|e| e.to_string())? {
            if m != message(whole) {
                return Err(format!("fragmented message {whole} came back different"));
            }
            whole += 1;
        }
        Ok(())
    };
    for i in 0..n {
        for (f, len) in fragments(&message(i)) {
            while !link.try_send(&f[..len])? {
                c.backpressured += 1;
                if !drain_echoes(link, &mut c, &mut check)? {
                    link.idle();
                }
                check_deadline(deadline, "fragmented client", &c)?;
            }
            c.sent += 1;
        }
    }
    while c.echoed < c.sent {
        if !drain_echoes(link, &mut c, &mut check)? {
            link.idle();
        }
        check_deadline(deadline, "fragmented client", &c)?;
    }
    if whole != n {
        return Err(format!("{whole} fragmented messages reassembled, {n} sent"));
    }
    end_server(link, deadline, &c)?;
    Ok(c)
}

fn end_server(link: &mut dyn RingLink, deadline: Instant, c: &Counts) -> Result<(), String> {
    while !link.try_send(&END)? {
        link.idle();
        check_deadline(deadline, "client (END)", c)?;
    }
    let mut buf = [0u8; MAX_PAYLOAD];
    loop {
        if let Some(len) = link.try_recv(&mut buf)? {
            if buf[..len] == END {
                return Ok(());
            }
            return Err("a message after the last echo".into());
        }
        link.idle();
        check_deadline(deadline, "client (END echo)", c)?;
    }
}

/// Depth-one round trips: returns each round trip's nanoseconds (after `warmup`).
pub fn depth_one_rtts(
    link: &mut dyn RingLink,
    warmup: u64,
    samples: u64,
    timeout: Duration,
) -> Result<Vec<u64>, String> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(samples as usize);
    let mut buf = [0u8; MAX_PAYLOAD];
    let msg = [0x5Au8; 32];
    for i in 0..warmup + samples {
        let t0 = Instant::now();
        while !link.try_send(&msg)? {
            link.idle();
        }
        loop {
            if let Some(len) = link.try_recv(&mut buf)? {
                if buf[..len] != msg {
                    return Err(format!("round trip {i}: wrong echo"));
                }
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("round trip {i}: no echo"));
            }
        }
        if i >= warmup {
            out.push(t0.elapsed().as_nanos() as u64);
        }
    }
    let c = Counts::default();
    end_server(link, deadline, &c)?;
    Ok(out)
}

/// Runs the client scenario named by `args` (`pipeline N`, `stream N`, `batches N BATCH`,
/// `fragmented N SIZE`, `rtt WARMUP N`) and returns its JSON line (without credit counts,
/// which belong to the backend).
pub fn client_scenario(
    link: &mut dyn RingLink,
    args: &[String],
    timeout: Duration,
) -> Result<String, String> {
    let num = |i: usize, what: &str| -> Result<u64, String> {
        args.get(i)
            .ok_or_else(|| format!("missing {what}"))?
            .parse()
            .map_err(|_| format!("bad {what}: {}", args[i]))
    };
    let t0 = Instant::now();
    let c = match args.first().map(String::as_str).unwrap_or("") {
        "pipeline" => run_client(link, num(1, "N")?, None, timeout)?,
        "stream" => run_stream(link, num(1, "N")?, timeout)?,
        "batches" => run_client(link, num(1, "N")?, Some(num(2, "BATCH")?), timeout)?,
        "fragmented" => run_fragmented(link, num(1, "N")?, num(2, "SIZE")? as usize, timeout)?,
        "rtt" => {
            let mut v = depth_one_rtts(link, num(1, "WARMUP")?, num(2, "N")?, timeout)?;
            if v.is_empty() {
                return Err("rtt: no samples".into());
            }
            v.sort_unstable();
            let q = |p: f64| v[((v.len() - 1) as f64 * p) as usize];
            return Ok(format!(
                "\"samples\":{},\"p50_ns\":{},\"p99_ns\":{},\"min_ns\":{}",
                v.len(),
                q(0.5),
                q(0.99),
                v[0]
            ));
        }
        s => {
            return Err(format!(
                "unknown scenario {s:?} (pipeline, stream, batches, fragmented, rtt)"
            ))
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    Ok(format!(
        "\"sent\":{},\"echoed\":{},\"backpressured\":{},\"secs\":{secs:.3},\"msgs_per_sec\":{:.0}",
        c.sent,
        c.echoed,
        c.backpressured,
        (c.sent + c.echoed) as f64 / secs.max(1e-9)
    ))
}
