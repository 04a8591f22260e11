//! Host stalls as a test against the fleet (pure): a stalled host inflates the endpoint
//! delays of every path it probes (prober delay) and answers (responder delay), while the
//! network RTT stays clean. Each path gives one observation per end; an observation
//! "exceeds" when it is past the fleet's bar (`DelayBaseline::bar`: robust to the few
//! stalled hosts in the data). Under the baseline a healthy host exceeds with the
//! learned rate; a stalled one on at least half of its observations. The test is the
//! binomial GLR of that, on the path p50s (a stall through the window) and on the p99s
//! (a stall in part of it, or one whose median hides under the bar).

use super::baseline::{Baseline, DelayBaseline, DelaySketch};
use super::placed::Placed;
use super::stats::{binomial_glr, binomial_llr};

/// The least share of a stalled host's observations past the bar.
pub const STALL_SHARE: f64 = 0.5;
/// A path's delay percentiles count once it has this many answered probes: the median
/// of a handful is one probe's delay, not the host's (a pinglist refresh leaves windows
/// of one probe behind).
pub const MIN_ANSWERED: u32 = 10;

/// One host's delay observations in one window.
#[derive(Debug, Default, Clone)]
pub struct HostDelays {
    /// (prober, responder) p50 observations.
    pub p50: Vec<u64>,
    pub p99: Vec<u64>,
    pub prober_p50: Vec<u64>,
    pub responder_p50: Vec<u64>,
    /// Past the bar, of p50 / p99 observations.
    pub exceed_p50: u32,
    pub exceed_p99: u32,
}

/// The four bars of one window.
#[derive(Debug, Clone, Copy)]
pub struct Bars {
    pub prober_p50: f64,
    pub responder_p50: f64,
    pub prober_p99: f64,
    pub responder_p99: f64,
}

/// What the window says about each host (indexed like `Placed::hosts`).
pub struct HostWindow {
    pub hosts: Vec<HostDelays>,
    pub bars: Bars,
    /// Exceedance rates under the baseline (p50, p99).
    pub q0: (f64, f64),
    /// The fleet's median prober and responder delay (ns), to state a stall's excess.
    pub fleet_p50: (f64, f64),
}

/// A host's test result.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostScore {
    /// GLR (nats), the larger of the p50 and p99 tests.
    pub score: f64,
    /// Observations and exceedances behind it.
    pub n: u32,
    pub k: u32,
}

/// The bar of one delay kind: the learned sketch when warm, else this window's own.
fn bar(learned: &DelayBaseline, window: &[u64]) -> f64 {
    if learned.sketch.warm() {
        return DelayBaseline::bar(&learned.sketch);
    }
    let mut s = DelaySketch::default();
    for &d in window {
        s.add(d, 1.0);
    }
    DelayBaseline::bar(&s)
}

fn median(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[(v.len() - 1) / 2]
}

/// Gathers every host's delays of the window and counts them against the bars.
pub fn gather(p: &Placed, base: &Baseline) -> HostWindow {
    let mut hosts = vec![HostDelays::default(); p.hosts.names.len()];
    let mut all = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for r in &p.paths {
        let s = &r.n;
        if s.probe_success < MIN_ANSWERED {
            continue;
        }
        all[0].push(s.prober_delay_p50_ns);
        all[1].push(s.responder_delay_p50_ns);
        all[2].push(s.prober_delay_p99_ns);
        all[3].push(s.responder_delay_p99_ns);
    }
    let bars = Bars {
        prober_p50: bar(&base.prober_p50, &all[0]),
        responder_p50: bar(&base.responder_p50, &all[1]),
        prober_p99: bar(&base.prober_p99, &all[2]),
        responder_p99: bar(&base.responder_p99, &all[3]),
    };
    for r in &p.paths {
        let s = &r.n;
        if s.probe_success < MIN_ANSWERED {
            continue;
        }
        let (hs, hd) = (r.hosts[0] as usize, r.hosts[1] as usize);
        for (h, d50, d99, b50, b99, prober) in [
            (
                hs,
                s.prober_delay_p50_ns,
                s.prober_delay_p99_ns,
                bars.prober_p50,
                bars.prober_p99,
                true,
            ),
            (
                hd,
                s.responder_delay_p50_ns,
                s.responder_delay_p99_ns,
                bars.responder_p50,
                bars.responder_p99,
                false,
            ),
        ] {
            let e = &mut hosts[h];
            e.p50.push(d50);
            e.p99.push(d99);
            if prober {
                e.prober_p50.push(d50);
            } else {
                e.responder_p50.push(d50);
            }
            e.exceed_p50 += (d50 as f64 > b50) as u32;
            e.exceed_p99 += (d99 as f64 > b99) as u32;
        }
    }
    let q0 = (
        base.prober_p50
            .exceed_rate()
            .max(base.responder_p50.exceed_rate()),
        base.prober_p99
            .exceed_rate()
            .max(base.responder_p99.exceed_rate()),
    );
    let fleet_p50 = (
        median(&mut all[0].clone()) as f64,
        median(&mut all[1].clone()) as f64,
    );
    HostWindow {
        hosts,
        bars,
        q0,
        fleet_p50,
    }
}

impl HostWindow {
    /// The GLR of host `h` being stalled.
    pub fn score(&self, h: u32) -> HostScore {
        let d = &self.hosts[h as usize];
        let n = d.p50.len() as f64;
        let (a, _) = binomial_glr(d.exceed_p50 as f64, n, self.q0.0, STALL_SHARE);
        let (b, _) = binomial_glr(d.exceed_p99 as f64, n, self.q0.1, STALL_SHARE);
        let (score, k) = if a >= b {
            (a, d.exceed_p50)
        } else {
            (b, d.exceed_p99)
        };
        HostScore {
            score,
            n: d.p50.len() as u32,
            k,
        }
    }

    /// Whether a stall found before still shows: this window favours a stall (half its
    /// observations past the bar) over the baseline, on the p50s or the p99s.
    pub fn continues(&self, h: u32) -> bool {
        let d = &self.hosts[h as usize];
        let n = d.p50.len() as f64;
        n > 0.0
            && (binomial_llr(d.exceed_p50 as f64, n, self.q0.0, STALL_SHARE) > 0.0
                || binomial_llr(d.exceed_p99 as f64, n, self.q0.1, STALL_SHARE) > 0.0)
    }

    /// The host's median prober and responder delay over the fleet's (ns, at least 0).
    pub fn excess(&self, h: u32) -> (u64, u64) {
        let d = &self.hosts[h as usize];
        let p = median(&mut d.prober_p50.clone()) as f64;
        let q = median(&mut d.responder_p50.clone()) as f64;
        (
            (p - self.fleet_p50.0).max(0.0) as u64,
            (q - self.fleet_p50.1).max(0.0) as u64,
        )
    }

    /// Teaches the baseline this window's delays, leaving out the hosts in `skip`.
    pub fn learn(&self, p: &Placed, base: &mut Baseline, skip: &[bool]) {
        for r in &p.paths {
            let s = &r.n;
            if s.probe_success < MIN_ANSWERED {
                continue;
            }
            let (hs, hd) = (r.hosts[0] as usize, r.hosts[1] as usize);
            if !skip[hs] {
                learn_one(
                    &mut base.prober_p50,
                    s.prober_delay_p50_ns,
                    self.bars.prober_p50,
                );
                learn_one(
                    &mut base.prober_p99,
                    s.prober_delay_p99_ns,
                    self.bars.prober_p99,
                );
            }
            if !skip[hd] {
                learn_one(
                    &mut base.responder_p50,
                    s.responder_delay_p50_ns,
                    self.bars.responder_p50,
                );
                learn_one(
                    &mut base.responder_p99,
                    s.responder_delay_p99_ns,
                    self.bars.responder_p99,
                );
            }
        }
    }
}

fn learn_one(d: &mut DelayBaseline, ns: u64, bar: f64) {
    d.sketch.add(ns, 1.0);
    d.exceed.events += (ns as f64 > bar) as u32 as f64;
    d.exceed.trials += 1.0;
}
