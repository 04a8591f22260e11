//! Probe pacing. Every `round_interval` each target is due once; one token bucket per
//! pinglist kind (aggregate rate = per-target rate x targets of that kind) caps the sends.
//! The kinds are independent: an exhausted ToR-mesh bucket never delays inter-ToR probes.

use std::collections::VecDeque;

use foldhash::{HashSet, HashSetExt};

use crate::{PinglistKind, TargetId};

const NS_PER_SEC: f64 = 1e9;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_sec: f64,
    burst: f64,
    tokens: f64,
    last_ns: u64,
}

impl TokenBucket {
    /// `rate_per_sec` tokens per second, at most `burst` saved. Starts full. A rate that
    /// is not a positive number never refills; a burst below 1 is raised to 1.
    pub fn new(rate_per_sec: f64, burst: f64, now_ns: u64) -> Self {
        let rate = if rate_per_sec.is_finite() && rate_per_sec > 0.0 {
            rate_per_sec
        } else {
            0.0
        };
        let burst = if burst.is_finite() && burst >= 1.0 {
            burst
        } else {
            1.0
        };
        TokenBucket {
            rate_per_sec: rate,
            burst,
            tokens: burst,
            last_ns: now_ns,
        }
    }

    fn tokens_at(&self, now_ns: u64) -> f64 {
        let dt = now_ns.saturating_sub(self.last_ns) as f64;
        (self.tokens + dt * self.rate_per_sec / NS_PER_SEC).min(self.burst)
    }

    pub fn try_take(&mut self, now_ns: u64) -> bool {
        // A clock that went backwards refills nothing but keeps the bucket usable.
        if now_ns >= self.last_ns {
            self.tokens = self.tokens_at(now_ns);
            self.last_ns = now_ns;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When the next token is available (now_ns if one is; u64::MAX if never).
    pub fn next_available_ns(&self, now_ns: u64) -> u64 {
        let t = self.tokens_at(now_ns);
        if t >= 1.0 {
            return now_ns;
        }
        if self.rate_per_sec <= 0.0 {
            return u64::MAX;
        }
        let wait = ((1.0 - t) * NS_PER_SEC / self.rate_per_sec).ceil().max(1.0);
        now_ns.max(self.last_ns).saturating_add(wait as u64)
    }
}

struct KindState {
    kind: PinglistKind,
    targets: Vec<TargetId>,
    queue: VecDeque<TargetId>,
    queued: HashSet<TargetId>,
    bucket: TokenBucket,
    /// This kind's round (the scheduler's unless set with `set_targets_every`).
    round_ns: u64,
    next_round_ns: u64,
    /// False for an empty target list or an unusable rate: nothing is polled.
    active: bool,
}

/// Round-based scheduler with one independent token bucket per pinglist kind.
pub struct ProbeScheduler {
    round_interval_ns: u64,
    kinds: Vec<KindState>,
    /// Index into `kinds` of the kind served last (fair alternation).
    last_served: usize,
}

impl ProbeScheduler {
    /// A round interval of 0 is treated as 1 ns.
    pub fn new(round_interval_ns: u64) -> Self {
        ProbeScheduler {
            round_interval_ns: round_interval_ns.max(1),
            kinds: Vec::new(),
            last_served: 0,
        }
    }

    /// Replaces the targets of one kind. `per_target_rate` is probes/s per target (> 0;
    /// otherwise the kind is idle). An existing kind keeps its round phase and the queued
    /// targets that are still listed; a new kind starts its first round at `now_ns`.
    pub fn set_targets(
        &mut self,
        kind: PinglistKind,
        targets: Vec<TargetId>,
        per_target_rate: f64,
        now_ns: u64,
    ) {
        let round = self.round_interval_ns;
        self.set_targets_every(kind, targets, per_target_rate, round, now_ns);
    }

    /// `set_targets` with this kind's own round (Hostping's R2R probes each peer once per
    /// `interval x peers`, whatever the cluster kinds' round is). 0 is taken as 1 ns.
    pub fn set_targets_every(
        &mut self,
        kind: PinglistKind,
        targets: Vec<TargetId>,
        per_target_rate: f64,
        round_ns: u64,
        now_ns: u64,
    ) {
        let round_ns = round_ns.max(1);
        let n = targets.len();
        let rate_ok = per_target_rate.is_finite() && per_target_rate > 0.0;
        // When the round, not the rate, limits each target (each is due once per round,
        // which is at least the rate allows), the bucket only bounds the aggregate: it
        // holds a round plus an eighth. With exactly a round's worth, a round that began a
        // hair after the last (a late wake, float rounding) found a token or two missing,
        // and their targets went out one by one after it, a wake-up each, every round.
        let rate_binds = per_target_rate * round_ns as f64 / NS_PER_SEC < 1.0 - 1e-9;
        let burst = if rate_binds { n } else { n + (n / 8).max(1) } as f64;
        let bucket = TokenBucket::new(per_target_rate * n as f64, burst, now_ns);
        let active = n > 0 && rate_ok;
        if let Some(k) = self.kinds.iter_mut().find(|k| k.kind == kind) {
            let keep: HashSet<TargetId> = targets.iter().copied().collect();
            k.queue.retain(|t| keep.contains(t));
            k.queued.retain(|t| keep.contains(t));
            k.targets = targets;
            k.bucket = bucket;
            k.active = active;
            if k.round_ns != round_ns {
                k.round_ns = round_ns;
                k.next_round_ns = k.next_round_ns.min(now_ns.saturating_add(round_ns));
            }
        } else {
            self.kinds.push(KindState {
                kind,
                targets,
                queue: VecDeque::new(),
                queued: HashSet::new(),
                bucket,
                round_ns,
                next_round_ns: now_ns,
                active,
            });
            self.kinds.sort_by_key(|k| k.kind);
        }
    }

    /// Next target due at `now_ns`, if any kind has one and a token for it.
    pub fn poll(&mut self, now_ns: u64) -> Option<(PinglistKind, TargetId)> {
        for k in self.kinds.iter_mut().filter(|k| k.active) {
            let interval = k.round_ns;
            if now_ns >= k.next_round_ns {
                // One round's worth even if several were missed; the next round starts
                // on the original grid.
                for &t in &k.targets {
                    if k.queued.insert(t) {
                        k.queue.push_back(t);
                    }
                }
                let missed = (now_ns - k.next_round_ns) / interval;
                k.next_round_ns += (missed + 1) * interval;
            }
        }
        let n = self.kinds.len();
        for step in 1..=n {
            let i = (self.last_served + step) % n;
            let k = &mut self.kinds[i];
            if !k.active || k.queue.is_empty() || !k.bucket.try_take(now_ns) {
                continue;
            }
            let t = k.queue.pop_front().expect("non-empty");
            k.queued.remove(&t);
            self.last_served = i;
            return Some((k.kind, t));
        }
        None
    }

    /// Earliest time `poll` may return something (None when nothing is scheduled).
    pub fn next_wakeup_ns(&self, now_ns: u64) -> Option<u64> {
        self.kinds
            .iter()
            .filter(|k| k.active)
            .map(|k| {
                if k.queue.is_empty() && k.next_round_ns > now_ns {
                    k.next_round_ns
                } else {
                    k.bucket.next_available_ns(now_ns)
                }
            })
            .min()
    }

    /// Targets of `kind` queued and waiting for a token.
    pub fn backlog(&self, kind: PinglistKind) -> usize {
        self.kinds
            .iter()
            .find(|k| k.kind == kind)
            .map_or(0, |k| k.queue.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PinglistKind::{InterTor, Service, TorMesh};

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    #[test]
    fn bucket_rate_and_burst() {
        let mut b = TokenBucket::new(10.0, 3.0, 0);
        assert!(b.try_take(0) && b.try_take(0) && b.try_take(0));
        assert!(!b.try_take(0));
        assert_eq!(b.next_available_ns(0), 100 * MS);
        assert!(!b.try_take(99 * MS));
        assert!(b.try_take(100 * MS));
        // Long idle refills only up to the burst.
        let mut n = 0;
        while b.try_take(100 * S) {
            n += 1;
        }
        assert_eq!(n, 3);
        assert_eq!(b.next_available_ns(100 * S), 100 * S + 100 * MS);
    }

    #[test]
    fn bucket_rejects_bad_rate() {
        let mut b = TokenBucket::new(f64::NAN, 0.0, 0);
        assert!(b.try_take(0));
        assert!(!b.try_take(1_000 * S));
        assert_eq!(b.next_available_ns(5), u64::MAX);
    }

    /// Runs the scheduler like the agent does until `end`: poll everything due, then
    /// sleep to the next wakeup. Returns (time, kind, target) of every poll.
    fn drive(s: &mut ProbeScheduler, start: u64, end: u64) -> Vec<(u64, PinglistKind, TargetId)> {
        let mut now = start;
        let mut out = Vec::new();
        while now < end {
            while let Some((k, t)) = s.poll(now) {
                out.push((now, k, t));
            }
            let next = s.next_wakeup_ns(now).expect("targets scheduled");
            assert!(next > now, "wakeup {next} must be in the future of {now}");
            now = next;
        }
        out
    }

    #[test]
    fn every_target_once_per_round_when_caps_do_not_bind() {
        let mut s = ProbeScheduler::new(500 * MS);
        s.set_targets(TorMesh, vec![1, 2, 3], 10.0, 0);
        let polls = drive(&mut s, 0, 10 * S);
        assert_eq!(polls.len(), 3 * 20);
        for round in 0..20u64 {
            let mut ts: Vec<_> = polls
                .iter()
                .filter(|p| p.0 >= round * 500 * MS && p.0 < (round + 1) * 500 * MS)
                .map(|p| p.2)
                .collect();
            ts.sort();
            assert_eq!(ts, [1, 2, 3], "round {round}");
        }
    }

    #[test]
    fn a_round_bound_kind_sends_each_round_in_one_burst_despite_late_wakes() {
        // 64 targets, 10/s each, a round of 100 ms: the round is the limit. Wakes come
        // 0.2 to 1.5 ms late (a driver's wake-up latency), and a wake less late than the
        // one before finds less than a round's refill since the last take; every round
        // still goes out at once.
        let mut s = ProbeScheduler::new(100 * MS);
        s.set_targets(TorMesh, (0..64).collect(), 10.0, 0);
        let mut now = 0;
        let mut wakes = 0;
        while now < 10 * S {
            let mut sent = 0;
            while s.poll(now).is_some() {
                sent += 1;
            }
            assert!(sent == 0 || sent == 64, "a round split: {sent} at {now}");
            wakes += 1;
            let late = if wakes % 2 == 0 { 200_000 } else { 1_500_000 };
            now = s.next_wakeup_ns(now).expect("targets scheduled") + late;
        }
        assert_eq!(wakes, 100, "one wake per round");
    }

    #[test]
    fn cap_binds_when_round_is_shorter_than_rate() {
        // Rounds every 100 ms but each target may go only once per second.
        let mut s = ProbeScheduler::new(100 * MS);
        s.set_targets(InterTor, vec![7], 1.0, 0);
        let polls = drive(&mut s, 0, 10 * S);
        // Burst of 1 at t=0, then one per second: t = 0, 1, ..., 9 s.
        assert_eq!(polls.len(), 10);
        for (i, p) in polls.iter().enumerate() {
            assert_eq!(p.0, i as u64 * S, "poll {i}");
        }
        // Never queued twice while waiting.
        assert!(s.backlog(InterTor) <= 1);
    }

    #[test]
    fn limiter_independence() {
        let mut s = ProbeScheduler::new(S);
        // ToR-mesh: 50 targets due every second but capped at 0.5/s each: saturated.
        s.set_targets(TorMesh, (0..50).collect(), 0.5, 0);
        s.set_targets(InterTor, vec![100, 101, 102], 1.0, 0);
        let polls = drive(&mut s, 0, 20 * S);
        let tor = polls.iter().filter(|p| p.1 == TorMesh).count();
        // 50 burst + 25/s for ~20 s.
        assert!((540..=560).contains(&tor), "tor-mesh polls {tor}");
        assert!(s.backlog(TorMesh) > 0, "tor-mesh bucket is the bottleneck");
        for round in 0..20u64 {
            let mut inter: Vec<_> = polls
                .iter()
                .filter(|p| p.1 == InterTor && p.0 >= round * S && p.0 < (round + 1) * S)
                .collect();
            assert_eq!(inter.len(), 3, "round {round}");
            for p in &inter {
                assert!(
                    p.0 - round * S <= MS,
                    "inter-ToR target {} late by {} ns",
                    p.2,
                    p.0 - round * S
                );
            }
            inter.sort_by_key(|p| p.2);
            assert_eq!(
                inter.iter().map(|p| p.2).collect::<Vec<_>>(),
                [100, 101, 102]
            );
        }
    }

    #[test]
    fn kinds_alternate() {
        let mut s = ProbeScheduler::new(S);
        s.set_targets(TorMesh, vec![1, 2, 3], 100.0, 0);
        s.set_targets(InterTor, vec![10, 11, 12], 100.0, 0);
        let kinds: Vec<_> = std::iter::from_fn(|| s.poll(0)).map(|p| p.0).collect();
        assert_eq!(
            kinds,
            [InterTor, TorMesh, InterTor, TorMesh, InterTor, TorMesh]
        );
    }

    #[test]
    fn set_targets_replaces_and_keeps_phase() {
        let mut s = ProbeScheduler::new(S);
        s.set_targets(TorMesh, vec![1, 2, 3], 1.0, 0);
        assert!(s.poll(0).is_some());
        s.set_targets(TorMesh, vec![2, 9], 1.0, 10 * MS);
        // 2 or 3 was still queued; only 2 survives, 9 waits for the next round.
        let mut got = Vec::new();
        while let Some((_, t)) = s.poll(20 * MS) {
            got.push(t);
        }
        assert!(got.iter().all(|&t| t == 2), "{got:?}");
        assert_eq!(s.next_wakeup_ns(20 * MS), Some(S));
        let mut got: Vec<_> = std::iter::from_fn(|| s.poll(S)).map(|p| p.1).collect();
        got.sort();
        assert_eq!(got, [2, 9]);
        // Emptying a kind stops it.
        s.set_targets(TorMesh, vec![], 1.0, S);
        assert_eq!(s.poll(5 * S), None);
        assert_eq!(s.next_wakeup_ns(5 * S), None);
    }

    #[test]
    fn rebuilt_bucket_follows_target_count() {
        let mut s = ProbeScheduler::new(100 * MS);
        s.set_targets(TorMesh, vec![1], 1.0, 0);
        s.set_targets(TorMesh, (1..=10).collect(), 1.0, 0);
        // 10 targets at 1/s each: burst 10, then 10/s aggregate.
        let polls = drive(&mut s, 0, 5 * S);
        assert!((55..=61).contains(&polls.len()), "{}", polls.len());
    }

    #[test]
    fn three_kinds_are_independent() {
        let mut s = ProbeScheduler::new(S);
        // ToR-mesh saturated (100 targets, 0.1/s each); inter-ToR and SERVICE keep their pace.
        s.set_targets(TorMesh, (0..100).collect(), 0.1, 0);
        s.set_targets(InterTor, vec![200, 201], 1.0, 0);
        s.set_targets(Service, vec![300, 301, 302], 2.0, 0);
        let polls = drive(&mut s, 0, 10 * S);
        let count = |k: PinglistKind| polls.iter().filter(|p| p.1 == k).count();
        assert_eq!(count(InterTor), 2 * 10);
        assert_eq!(count(Service), 3 * 10);
        let tor = count(TorMesh);
        // 100 burst + 10/s for ~10 s.
        assert!((190..=205).contains(&tor), "tor-mesh polls {tor}");
        for round in 0..10u64 {
            let svc: Vec<_> = polls
                .iter()
                .filter(|p| p.1 == Service && p.0 >= round * S && p.0 < (round + 1) * S)
                .collect();
            assert_eq!(svc.len(), 3, "round {round}");
            assert!(
                svc.iter().all(|p| p.0 - round * S <= MS),
                "service probes delayed in round {round}"
            );
        }
        // Emptying SERVICE leaves the others running.
        s.set_targets(Service, vec![], 2.0, 10 * S);
        let later = drive(&mut s, 10 * S, 12 * S);
        assert!(later.iter().all(|p| p.1 != Service));
        assert!(later.iter().any(|p| p.1 == InterTor));
    }

    #[test]
    fn kinds_alternate_over_three() {
        let mut s = ProbeScheduler::new(S);
        s.set_targets(Service, vec![20, 21], 100.0, 0);
        s.set_targets(TorMesh, vec![1, 2], 100.0, 0);
        s.set_targets(InterTor, vec![10, 11], 100.0, 0);
        let kinds: Vec<_> = std::iter::from_fn(|| s.poll(0)).map(|p| p.0).collect();
        assert_eq!(
            kinds,
            [InterTor, Service, TorMesh, InterTor, Service, TorMesh]
        );
        assert_eq!(PinglistKind::ALL.map(|k| k as i32), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_kind_with_its_own_round_keeps_it() {
        // ToR-mesh on the scheduler's 1 s round; Host on a 300 ms round (3 peers at one
        // probe per 100 ms): over 3 s, ToR-mesh targets are due 3 times, Host ones 10.
        let mut s = ProbeScheduler::new(S);
        s.set_targets(TorMesh, vec![1, 2], 100.0, 0);
        s.set_targets_every(
            PinglistKind::Host,
            vec![7, 8, 9],
            1e9 / 300e6,
            300_000_000,
            0,
        );
        let mut sent: std::collections::BTreeMap<PinglistKind, usize> = Default::default();
        let mut now = 0;
        while now < 3 * S {
            while let Some((k, _)) = s.poll(now) {
                *sent.entry(k).or_default() += 1;
            }
            now += 1_000_000;
        }
        assert_eq!(sent[&TorMesh], 6);
        assert_eq!(sent[&PinglistKind::Host], 30);
    }
}
