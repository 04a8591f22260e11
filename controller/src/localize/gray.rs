//! The gray-failure detector (pure): names the components whose loss, delay or stall the
//! fleet's learned baseline does not explain, however small, once the evidence is strong.
//!
//! Each window adds its evidence (`evidence.rs`) to a history of the last few windows.
//! A component is scored by a generalized likelihood ratio over every unit that crosses
//! it (`stats.rs`), on the best run of recent windows ending now: a persistent small
//! excess accumulates evidence window after window instead of being thrown away, and a
//! big one is named in its first window. The components are explained greedily: the
//! strongest is named first and its units are put down to it (for good: a finding's
//! evidence stays its own), which clears the components that only shared a few of them
//! (the other links a lossy link's probes crossed, the RNICs behind it). What no
//! component explains strongly enough is what it was: noise.
//!
//! A named component stays named while each new window favours its fault (at half the
//! size estimated) over the baseline; `resolve_after_windows` windows that do not, and
//! it is let go. What it does not put down to a component, the baseline learns from.

use std::collections::{BTreeMap, VecDeque};

use super::baseline::Baseline;
use super::evidence::{self, Component, Components, Skip, WindowEvidence};
use super::hoststat::HostWindow;
use super::placed::Placed;
use super::stats::{binomial_glr, binomial_llr, poisson_glr, poisson_llr, poisson_stderr};
use super::tally::{self, Tally, Test};
use crate::topology::Topology;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrayParams {
    /// Windows of evidence a score may sum (the longest run it considers).
    pub history_windows: usize,
    /// Evidence (nats) that names a component, at least: the bar rises with the number
    /// of tests a day makes (see `false_findings_per_day`).
    pub open_score: f64,
    /// The fleet's budget of findings by chance per day. A likelihood ratio of e^x
    /// passes by chance with a probability of at most about e^-x under the baseline, and
    /// a day tests every component in every window over every run of windows: the bar
    /// is ln(tests a day / budget), so it grows with the fleet (a fixed bar that is
    /// safe for a hundred RNICs names a component by chance every day at 100,000).
    pub false_findings_per_day: f64,
    /// Evidence that makes it a suspect: its paths get more probes, the baseline does
    /// not learn from it.
    pub suspect_score: f64,
    /// The least drop probability per packet a loss finding claims.
    pub min_loss: f64,
    /// The least rise in the share of slow probes a latency finding claims.
    pub min_slow_share: f64,
    /// Windows that no longer favour a named fault before it is let go.
    pub resolve_after_windows: u32,
}

impl Default for GrayParams {
    fn default() -> Self {
        GrayParams {
            history_windows: 4,
            open_score: 16.0,
            false_findings_per_day: 0.01,
            suspect_score: 6.0,
            min_loss: 0.002,
            min_slow_share: 0.2,
            resolve_after_windows: 2,
        }
    }
}

/// A component the detector has named, and what it has put down to it.
#[derive(Debug, Clone)]
struct Active {
    /// Effect at naming: drop probability (loss), slow share (latency).
    effect: f64,
    score: f64,
    misses: u32,
    /// Over the windows it was blamed in: events, expected, exposure (loss); slow and
    /// answered probes (latency).
    k: f64,
    mu0: f64,
    exposure: f64,
    slow: f64,
    answered: f64,
    /// Excess delay of its slow units (latency), stall excess (stall), bounded.
    excess: Vec<u64>,
}

impl Active {
    fn new(effect: f64, score: f64) -> Self {
        Active {
            effect,
            score,
            misses: 0,
            k: 0.0,
            mu0: 0.0,
            exposure: 0.0,
            slow: 0.0,
            answered: 0.0,
            excess: Vec::new(),
        }
    }
}

/// One component blamed in this window.
#[derive(Debug, Clone)]
pub struct GrayBlame {
    pub component: Component,
    pub test: Test,
    /// Evidence (nats): at naming, or the best since.
    pub score: f64,
    /// Loss: drop probability per packet and its standard error; latency: median excess
    /// (ns) of its slow probes; stall: excess endpoint delay (ns).
    pub loss: (f64, f64),
    pub excess_ns: u64,
    /// Its units in this window: (path index, label).
    pub units: Vec<(u32, u32)>,
    /// Probes and events behind it (this window).
    pub probes: f64,
    pub events: f64,
}

/// A component with some evidence but not enough (adaptive probing looks at these).
#[derive(Debug, Clone, PartialEq)]
pub struct Suspect {
    pub component: Component,
    pub test: Test,
    pub score: f64,
}

pub struct GrayDetector {
    params: GrayParams,
    /// The evidence that names a component in this window (`set_bar`).
    bar: f64,
    comps: Components,
    history: VecDeque<WindowEvidence>,
    active: BTreeMap<(u32, Test), Active>,
    pub baseline: Baseline,
    suspects: Vec<Suspect>,
}

/// The evidence that names a component when `components` are tested in windows of
/// `window_ms` (0: unknown, 30 s): ln(tests a day / budget), at least `open_score`. A day
/// tests every component (hosts included) in every window, over each run of windows a
/// score may sum.
pub fn bar_for(p: &GrayParams, components: usize, window_ms: u64) -> f64 {
    // Summaries that do not say how long their window was: the agents' default.
    let window_ms = if window_ms == 0 {
        30_000
    } else {
        window_ms.max(1_000)
    };
    let windows_per_day = 86_400_000.0 / window_ms as f64;
    let tests = components.max(1) as f64 * p.history_windows.max(1) as f64 * windows_per_day;
    let budget = p.false_findings_per_day.max(1e-12);
    p.open_score.max((tests / budget).ln())
}

/// Whether (c, t) takes unit `u` when it is named: the units whose events count for it,
/// and the lost probes whose ACKs crossed it. Both ACKs lost reads as a lost probe (at
/// 16% per packet, 2.6% of the probes), which counts for the probe's links alone: left
/// to them, a strong downlink raised false uplinks on the other spines of its ToR.
pub(super) fn claims(u: &evidence::Unit, c: u32, t: Test) -> bool {
    counts(u, c, t) > 0.0 || (t == Test::Loss && u.failed > 0.0 && u.latency.contains(&c))
}

/// Units of window `w` that count for (component, test).
fn counts(u: &evidence::Unit, c: u32, t: Test) -> f64 {
    match t {
        Test::Loss => u
            .loss
            .iter()
            .find(|&&(x, _)| x == c)
            .map_or(0.0, |&(_, e)| e),
        Test::Latency => {
            if u.slow > 0.0 && u.latency.contains(&c) {
                u.slow
            } else {
                0.0
            }
        }
        Test::Stall => 0.0,
    }
}

impl GrayDetector {
    pub fn new(params: GrayParams) -> Self {
        GrayDetector {
            params,
            bar: params.open_score,
            comps: Components::default(),
            history: VecDeque::new(),
            active: BTreeMap::new(),
            baseline: Baseline::default(),
            suspects: Vec::new(),
        }
    }

    /// Sets the bar for this window (see [`bar_for`]).
    pub fn set_bar(&mut self, window_ms: u64) {
        self.bar = bar_for(&self.params, self.comps.len(), window_ms);
    }

    /// The evidence that names a component in this window.
    pub fn bar(&self) -> f64 {
        self.bar
    }

    /// The components named (and not let go) so far.
    pub fn active(&self) -> impl Iterator<Item = &Component> {
        self.active
            .keys()
            .map(|(c, _)| &self.comps.list[*c as usize])
    }

    /// The suspects of the last window (strongest first).
    pub fn suspects(&self) -> &[Suspect] {
        &self.suspects
    }

    /// Hosts: names the stalled ones and says whose paths the network tests must leave
    /// out (stalled, or showing some stall: their timeouts are their own). Returns the
    /// blames and the skip mask (by `Placed` host index).
    pub fn hosts(&mut self, p: &Placed, hw: &HostWindow) -> (Vec<GrayBlame>, Vec<bool>) {
        let n = p.hosts.names.len();
        let mut skip = vec![false; n];
        let mut blames = Vec::new();
        for h in 0..n as u32 {
            let name = &p.hosts.names[h as usize];
            let c = self.comps.id(Component::Host(name.clone()));
            let sc = hw.score(h);
            let key = (c, Test::Stall);
            let blamed = match self.active.get_mut(&key) {
                Some(a) if hw.continues(h) => {
                    a.misses = 0;
                    a.score = a.score.max(sc.score);
                    true
                }
                Some(a) => {
                    a.misses += 1;
                    if a.misses >= self.params.resolve_after_windows.max(1) {
                        self.active.remove(&key);
                    }
                    false
                }
                None if sc.score >= self.bar => {
                    self.active.insert(key, Active::new(1.0, sc.score));
                    true
                }
                None => false,
            };
            if blamed || sc.score >= self.params.suspect_score {
                skip[h as usize] = true;
            }
            if blamed {
                let (ex_p, ex_r) = hw.excess(h);
                let a = self.active.get_mut(&key).expect("named");
                a.excess.push(ex_p.max(ex_r));
                if a.excess.len() > 256 {
                    a.excess.remove(0);
                }
                // Over the windows it was blamed in: the first and last see part of it.
                let mut ex = a.excess.clone();
                ex.sort_unstable();
                let excess_ns = ex[ex.len() / 2];
                blames.push(GrayBlame {
                    component: Component::Host(name.clone()),
                    test: Test::Stall,
                    score: a.score,
                    loss: (0.0, 0.0),
                    excess_ns,
                    units: Vec::new(),
                    probes: sc.n as f64,
                    events: sc.k as f64,
                });
            }
        }
        (blames, skip)
    }

    /// The network: adds the window's evidence, keeps the named components that still
    /// show, names new ones greedily, and learns the baseline from the rest.
    pub fn network(
        &mut self,
        p: &Placed,
        topo: Option<&Topology>,
        skip: &Skip<'_>,
        skip_host: &[bool],
    ) -> Vec<GrayBlame> {
        let w = evidence::build(p, topo, &self.baseline, &mut self.comps, skip, skip_host);
        self.history.push_back(w);
        while self.history.len() > self.params.history_windows.max(1) {
            self.history.pop_front();
        }
        let mut blamed: Vec<(u32, Test)> = Vec::new();
        self.continue_active(&mut blamed);
        self.name_new(&mut blamed);
        let out = blamed.iter().map(|&key| self.blame(key)).collect();
        self.learn_network();
        out
    }

    /// The share of slow probes the baseline expects: the learned one, or the fleet's in
    /// the newest window when that is higher (a cold controller, or a fleet whose clocks
    /// are all jittery, does not take a common condition for a fault).
    fn slow_rate(&self) -> f64 {
        let w = self.history.back().expect("a window");
        let now = if w.label_answered > 0.0 {
            w.label_slow / w.label_answered
        } else {
            0.0
        };
        self.baseline.slow_rate().max(now)
    }

    /// Sums of (events, expected, exposure, answered) of (c, t) over the last `s`
    /// windows' unowned units.
    fn sums(&self, c: u32, t: Test, s: usize) -> (f64, f64, f64, f64) {
        let h = self.history.len();
        let (mut k, mut mu0, mut e, mut n) = (0.0, 0.0, 0.0, 0.0);
        for w in self.history.iter().skip(h - s.min(h)) {
            let x = w.at(c);
            mu0 += x.mu0;
            e += x.exposure;
            n += x.answered;
            k += w
                .units
                .iter()
                .filter(|u| u.owner.is_none())
                .map(|u| counts(u, c, t))
                .sum::<f64>();
        }
        (k, mu0, e, n)
    }

    fn score_of(&self, t: Test, k: f64, mu0: f64, e: f64, n: f64) -> (f64, f64) {
        match t {
            Test::Loss => poisson_glr(k, mu0, e, self.params.min_loss),
            Test::Latency => binomial_glr(k, n, self.slow_rate(), self.params.min_slow_share),
            Test::Stall => (0.0, 0.0),
        }
    }

    /// Puts (c, t)'s unowned units down to it: the whole history, or the newest window;
    /// a tally of the unowned counts follows.
    fn claim(&mut self, c: u32, t: Test, newest_only: bool, mut tally: Option<&mut Tally>) {
        let h = self.history.len();
        let from = if newest_only { h - 1 } else { 0 };
        for (wi, w) in self.history.iter_mut().enumerate().skip(from) {
            for u in w.units.iter_mut().filter(|u| u.owner.is_none()) {
                if claims(u, c, t) {
                    u.owner = Some(c);
                    if let Some(tally) = tally.as_deref_mut() {
                        tally.remove(wi, u);
                    }
                }
            }
        }
    }

    fn continue_active(&mut self, blamed: &mut Vec<(u32, Test)>) {
        let mut keys: Vec<((u32, Test), f64)> = self
            .active
            .iter()
            .filter(|(k, _)| k.1 != Test::Stall)
            .map(|(k, a)| (*k, a.score))
            .collect();
        keys.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let q0 = self.slow_rate();
        for ((c, t), _) in keys {
            let (k, mu0, e, n) = self.sums(c, t, 1);
            let a = self.active.get(&(c, t)).expect("active");
            let favours = match t {
                Test::Loss => {
                    let x = (a.effect / 2.0).max(self.params.min_loss);
                    e > 0.0 && poisson_llr(k, mu0, x * e) > 0.0
                }
                _ => {
                    let q1 = q0 + ((a.effect - q0) / 2.0).max(self.params.min_slow_share);
                    n > 0.0 && binomial_llr(k, n, q0, q1) > 0.0
                }
            };
            if favours {
                self.claim(c, t, true, None);
                let a = self.active.get_mut(&(c, t)).expect("active");
                a.misses = 0;
                a.k += k;
                a.mu0 += mu0;
                a.exposure += e;
                a.slow += k;
                a.answered += n;
                blamed.push((c, t));
            } else {
                let a = self.active.get_mut(&(c, t)).expect("active");
                a.misses += 1;
                if a.misses >= self.params.resolve_after_windows.max(1) {
                    self.active.remove(&(c, t));
                }
            }
        }
    }

    /// (score, effect, run length) of key `k`'s best run of windows ending now.
    fn best_run(&self, tally: &Tally, k: usize) -> (f64, f64, usize) {
        let h = self.history.len();
        let (c, t) = tally::key_parts(k);
        let ks = tally.counts(k);
        let (mut kk, mut mu0, mut e, mut n) = (0.0, 0.0, 0.0, 0.0);
        let mut top = (f64::MIN, 0.0, 1);
        // Runs of the last s windows, s = 1..h.
        for s in 1..=h {
            let wi = h - s;
            let w = &self.history[wi];
            kk += ks[wi];
            let x = w.at(c);
            mu0 += x.mu0;
            e += x.exposure;
            n += x.answered;
            let (score, effect) = self.score_of(t, kk, mu0, e, n);
            if score > top.0 {
                top = (score, effect, s);
            }
        }
        top
    }

    /// Names new components, strongest first, while one's evidence passes the bar; the
    /// rest above the suspect bar are the suspects.
    fn name_new(&mut self, blamed: &mut Vec<(u32, Test)>) {
        let h = self.history.len();
        self.suspects.clear();
        let mut tally = Tally::new(self.history.iter(), self.comps.len());
        let touched = std::mem::take(&mut tally.touched);
        let mut named: Vec<bool> = touched
            .iter()
            .map(|&k| self.active.contains_key(&tally::key_parts(k)))
            .collect();
        let mut runs: Vec<(f64, f64, usize)> = touched
            .iter()
            .zip(&named)
            .map(|(&k, &a)| {
                if a {
                    (f64::MIN, 0.0, 1)
                } else {
                    self.best_run(&tally, k)
                }
            })
            .collect();
        loop {
            // The strongest; ties to the lowest (component, test).
            let mut best: Option<(usize, (f64, f64, usize))> = None;
            for (pos, run) in runs.iter().enumerate() {
                if !named[pos] && best.is_none_or(|b| run.0 > b.1 .0) {
                    best = Some((pos, *run));
                }
            }
            match best {
                Some((pos, (score, effect, s))) if score >= self.bar => {
                    let (c, t) = tally::key_parts(touched[pos]);
                    let (mut k, mut mu0, mut e, mut n) = (0.0, 0.0, 0.0, 0.0);
                    let ks = tally.counts(touched[pos]);
                    // The run of the last s windows, oldest first.
                    let from = h - s.min(h);
                    for (w, &kw) in self.history.iter().zip(ks).skip(from) {
                        let x = w.at(c);
                        mu0 += x.mu0;
                        e += x.exposure;
                        n += x.answered;
                        k += kw;
                    }
                    self.claim(c, t, false, Some(&mut tally));
                    let mut a = Active::new(effect, score);
                    a.k = k;
                    a.mu0 = mu0;
                    a.exposure = e;
                    a.slow = k;
                    a.answered = n;
                    self.active.insert((c, t), a);
                    blamed.push((c, t));
                    named[pos] = true;
                    for (p, &key) in touched.iter().enumerate() {
                        if tally.take_dirty(key) && !named[p] {
                            runs[p] = self.best_run(&tally, key);
                        }
                    }
                }
                _ => {
                    let mut scored: Vec<(usize, f64)> = touched
                        .iter()
                        .zip(&runs)
                        .zip(&named)
                        .filter(|((_, r), &a)| !a && r.0 >= self.params.suspect_score)
                        .map(|((&k, r), _)| (k, r.0))
                        .collect();
                    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                    self.suspects = scored
                        .into_iter()
                        .map(|(k, score)| {
                            let (c, t) = tally::key_parts(k);
                            Suspect {
                                component: self.comps.list[c as usize].clone(),
                                test: t,
                                score,
                            }
                        })
                        .collect();
                    return;
                }
            }
        }
    }

    /// What (c, t) blames in the newest window.
    fn blame(&mut self, (c, t): (u32, Test)) -> GrayBlame {
        let newest = self.history.back().expect("a window");
        let mut units = Vec::new();
        let (mut probes, mut events) = (0.0, 0.0);
        let mut excess = Vec::new();
        for u in newest.units.iter().filter(|u| u.owner == Some(c)) {
            units.push((u.path, u.label));
            probes += u.probes;
            events += counts(u, c, t);
            if u.slow > 0.0 {
                excess.push(u.excess_ns);
            }
        }
        let a = self.active.get_mut(&(c, t)).expect("active");
        a.excess.extend(excess.iter().copied().take(64));
        if a.excess.len() > 256 {
            a.excess.drain(..a.excess.len() - 256);
        }
        let mut ex = a.excess.clone();
        ex.sort_unstable();
        let excess_ns = ex.get(ex.len().saturating_sub(1) / 2).copied().unwrap_or(0);
        // The size now when this window says enough (a fault that grew: an RNIC going
        // down after losing a little), else over every window it was blamed in.
        let now = newest.at(c);
        let (mu_now, e_now) = (now.mu0, now.exposure);
        let loss = if t == Test::Loss && events >= 10.0 && e_now > 0.0 {
            (
                ((events - mu_now) / e_now).max(0.0),
                poisson_stderr(events, e_now),
            )
        } else {
            (
                ((a.k - a.mu0) / a.exposure.max(1.0)).max(0.0),
                poisson_stderr(a.k, a.exposure),
            )
        };
        GrayBlame {
            component: self.comps.list[c as usize].clone(),
            test: t,
            score: a.score,
            loss,
            excess_ns,
            units,
            probes,
            events,
        }
    }

    /// The newest window teaches the baseline, but for the units put down to a
    /// component or crossing a suspect.
    fn learn_network(&mut self) {
        let suspects: Vec<u32> = self
            .suspects
            .iter()
            .filter_map(|s| self.comps.get(&s.component))
            .collect();
        let w = self.history.back().expect("a window");
        let mut totals = w.totals;
        let (mut answered, mut slow) = (w.label_answered, w.label_slow);
        for u in &w.units {
            let suspect = u.loss.iter().any(|(c, _)| suspects.contains(c))
                || u.latency.iter().any(|c| suspects.contains(c));
            if u.owner.is_some() || suspect {
                let t = &mut totals[u.inter as usize];
                t.0 -= u.probes;
                t.1 -= u.failed;
                t.2 -= u.invalid;
                if u.in_label_totals {
                    answered -= u.answered;
                    slow -= u.slow;
                }
            }
        }
        let b = &mut self.baseline;
        let [(lp, lf, li), (ip, if_, ii)] = totals;
        b.local.learn(lp.max(0.0), lf.max(0.0), li.max(0.0));
        b.inter.learn(ip.max(0.0), if_.max(0.0), ii.max(0.0));
        b.learn_slow(slow.max(0.0), answered.max(0.0));
    }

    /// Ends the window for the baseline (after the hosts learned theirs).
    pub fn end_window(&mut self) {
        self.baseline.end_window();
    }
}
