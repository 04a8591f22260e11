//! Component findings over time: the leader's findings tick (localize the settled windows,
//! attach each finding's impact, publish on WatchFindings, store the changes), adaptive
//! probing's refocus and the await of a window's localization, the learned baseline's
//! save and restore, and forwarding reports from a follower to the leader.

use super::*;

/// Finding changes a WatchFindings subscriber may fall behind by before it is cut off
/// with DATA_LOSS (it then calls again for a fresh snapshot). This bounds what the server
/// buffers per subscriber.
pub const FINDINGS_CHANNEL_CAPACITY: usize = 4096;

/// Resolved findings in a WatchFindings snapshot (the most recently resolved; every open
/// finding is in it).
pub const WATCH_SNAPSHOT_RESOLVED: usize = 100;

/// Changed findings kept for the next tick while the store fails to take them; past this
/// the oldest ids are given up (logged).
pub(super) const UNSAVED_FINDINGS_CAP: usize = 10_000;

/// Sets the impact (`crate::impact`) of every finding `events` open or update, on the
/// events and on the analyzer's findings.
pub(super) fn attach_impact(
    a: &mut Analyzer,
    idx: &RegistryIndex,
    paths: &[ServicePath],
    events: &mut [FindingEvent],
) {
    for e in events.iter_mut() {
        let Some(f) = e.finding.as_mut().filter(|f| f.open) else {
            continue;
        };
        f.impact = crate::impact::impact(f, paths, idx, a.localizer().topology());
        a.localizer_mut().set_impact(f.id, f.impact.clone());
    }
}

/// An agent awaiting a window's localization (adaptive probing) is answered at most this
/// long after the window's settle time, and after at most [`AWAIT_MAX`] (below the
/// agents' 10 s RPC timeout; an agent answered before the window was localized awaits
/// again).
pub const AWAIT_MARGIN: Duration = Duration::from_secs(2);
pub const AWAIT_MAX: Duration = Duration::from_secs(8);

/// The store key of the gray detector's learned baseline, and how many windows it learns
/// between two writes (five minutes of 30 s windows).
pub const BASELINE_KEY: &str = "gray_baseline";
pub(super) const BASELINE_SAVE_WINDOWS: u64 = 10;

/// Takes the stored baseline over, if there is one (a damaged one: logged, start cold).
pub(super) fn restore_baseline(registry: &IndexedRegistry, a: &mut Analyzer) {
    match registry.load_state(BASELINE_KEY) {
        Ok(Some(json)) => match a.localizer_mut().restore_baseline(&json) {
            Ok(()) => tracing::info!(
                windows = a.localizer().baseline_windows(),
                "learned baseline restored from the store"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "the stored baseline cannot be read; learning anew")
            }
        },
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "cannot load the learned baseline; learning anew"),
    }
}

impl ControllerState {
    /// Localizes the windows that have settled (see [`Analyzer::tick`]), publishes the
    /// changes to WatchFindings and writes the changed findings to the store. The server
    /// calls it every second, off the async workers (the store write blocks). Returns the
    /// changes.
    pub fn findings_tick(&self) -> Vec<FindingEvent> {
        if !self.lead_now() {
            return Vec::new();
        }
        let now = self.now_ns();
        // What the findings a window moves hurt: the live service paths, read before the
        // analyzer lock is taken (lock order: index, service paths, analyzer).
        let due = self.analyzer().is_some_and(|a| a.window_due(now));
        let services = due.then(|| self.service_paths(&ServicePathFilter::default()));
        let events = self.step_findings(|a, idx| {
            let mut events = a.tick(now, idx);
            self.refocus(a, idx, now / 1_000_000_000);
            if let Some(paths) = &services {
                attach_impact(a, idx, paths, &mut events);
            }
            self.annotate_events(idx, &mut events);
            events
        });
        self.save_baseline();
        self.advance_traces();
        if let Some(through) = self.analyzer().and_then(|a| a.localized_through()) {
            self.localized.send_if_modified(|v| {
                let moved = *v != through;
                *v = through;
                moved
            });
        }
        events
    }

    /// Waits until the window starting at `start` is localized (so the FOCUS lists
    /// follow it), when this replica analyzes and holds unlocalized summaries of a window
    /// that has ended; at most until the window's settle time has passed by
    /// [`AWAIT_MARGIN`], and never past shutdown. Anything else answers at once.
    pub async fn await_localized(&self, start: u64) {
        if !self.leadership.is_leader() {
            return;
        }
        let Some((window_ns, settle_ns)) = self
            .analyzer()
            .and_then(|a| Some((a.pending_window(start)?, a.params().localize_settle_ns)))
        else {
            return;
        };
        let now = self.now_ns();
        let end = start.saturating_add(window_ns);
        if end > now.saturating_add(AWAIT_MARGIN.as_nanos() as u64) {
            return; // not over yet: its summaries are not all in
        }
        let deadline = end
            .saturating_add(settle_ns)
            .saturating_add(AWAIT_MARGIN.as_nanos() as u64);
        let wait = Duration::from_nanos(deadline.saturating_sub(now)).min(AWAIT_MAX);
        let mut localized = self.localized.subscribe();
        let mut stopping = self.stopping.subscribe();
        // A new FOCUS generation (an operator's trace) answers at once too: the agent
        // fetches it, then awaits the window again.
        let mut moved = self.focus_moved.subscribe();
        moved.borrow_and_update();
        tokio::select! {
            _ = tokio::time::timeout(wait, localized.wait_for(|&s| s >= start)) => {}
            _ = moved.changed() => {}
            _ = stopping.wait_for(|s| *s) => {}
        }
    }

    /// The start of the newest window localized (0: none yet).
    pub fn localized_through(&self) -> u64 {
        *self.localized.borrow()
    }

    /// After a window was localized: the FOCUS lists follow the gray detector's suspects
    /// (adaptive probing). Runs under the index and analyzer locks (that order).
    pub(super) fn refocus(&self, a: &Analyzer, idx: &RegistryIndex, now_sec: u64) {
        let windows = a.localizer().baseline_windows();
        if self.focus_windows.swap(windows, Ordering::Relaxed) == windows {
            return;
        }
        let mut f = self.focus.lock().unwrap_or_else(|e| e.into_inner());
        if f.update(
            a.localizer().suspects(),
            idx,
            a.localizer().topology(),
            now_sec,
        ) {
            tracing::info!(
                generation = f.generation(),
                targets = f.target_count(),
                focused = ?f.focused().collect::<Vec<_>>(),
                "FOCUS pinglists changed (adaptive probing)"
            );
            self.focus_moved.send_replace(f.generation());
        }
    }

    /// (FOCUS targets handed out now, FOCUS probes ingested so far): what adaptive
    /// probing costs.
    pub fn focus_stats(&self) -> (u64, u64) {
        let probes = self.analyzer().map_or(0, |a| a.focus_probes_total());
        let targets = self
            .focus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .target_count();
        (targets as u64, probes)
    }

    /// The FOCUS lists' generation agents compare with theirs (acks carry it).
    pub fn focus_generation(&self) -> u64 {
        self.focus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .generation()
    }

    /// Writes the gray detector's learned baseline to the store after its first window,
    /// then every `BASELINE_SAVE_WINDOWS` windows it learns (no lock held during the
    /// write).
    pub(super) fn save_baseline(&self) {
        let Some(a) = self.analyzer() else { return };
        let windows = a.localizer().baseline_windows();
        let saved = self.baseline_saved.load(Ordering::Relaxed);
        // The first window learned is stored at once, then every few.
        if windows == 0
            || (saved != u64::MAX && windows < saved.saturating_add(BASELINE_SAVE_WINDOWS))
        {
            return;
        }
        let json = a.localizer().baseline_json();
        drop(a);
        match self.registry.save_state(BASELINE_KEY, &json) {
            Ok(()) => self.baseline_saved.store(windows, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(error = %e, "storing the learned baseline failed; retrying later")
            }
        }
    }

    /// Whether this replica analyzes now. At the first tick after it was elected, it takes
    /// over the stored findings (the previous leader's), so they continue with their ids
    /// and none is opened twice.
    pub(super) fn lead_now(&self) -> bool {
        let leads = self.leadership.is_leader();
        let led = self.led.swap(leads, Ordering::SeqCst);
        if leads && !led {
            match self.registry.load_findings() {
                Ok(f) => {
                    let open = f.iter().filter(|f| f.open).count();
                    if let Some(mut a) = self.analyzer() {
                        a.localizer_mut().reset_to(f);
                        restore_baseline(&self.registry, &mut a);
                    }
                    tracing::info!(
                        open,
                        "analysis taken over; the stored findings continue here"
                    );
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot load the findings to take over analysis; retrying");
                    self.led.store(false, Ordering::SeqCst);
                    return false;
                }
            }
        }
        leads
    }

    /// Sends agents' path reports to the leader when another replica leads. None: this
    /// replica takes them (it leads, no leader is known, or the leader cannot be reached).
    pub async fn forward_to_leader(&self, req: &ProbeAnalysisReport) -> Option<ProbeAnalysisAck> {
        let addr = self.leadership.forward_to()?;
        let client = {
            let mut m = self
                .leader_clients
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match m.get(&addr) {
                Some(c) => c.clone(),
                None => {
                    let scheme = if self.replica_tls.is_some() {
                        "https"
                    } else {
                        "http"
                    };
                    let mut ep =
                        tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))
                            .ok()?
                            .connect_timeout(Duration::from_secs(2))
                            .timeout(Duration::from_secs(5));
                    if let Some(tls) = &self.replica_tls {
                        ep = match ep.tls_config(tls.clone()) {
                            Ok(ep) => ep,
                            Err(e) => {
                                tracing::warn!(leader = %addr, error = %e, "TLS to the analysis leader cannot be set up; report kept here");
                                return None;
                            }
                        };
                    }
                    let c = ControllerServiceClient::new(ep.connect_lazy());
                    m.insert(addr.clone(), c.clone());
                    c
                }
            }
        };
        match client.clone().report_probe_analysis(req.clone()).await {
            Ok(r) => Some(r.into_inner()),
            Err(e) => {
                tracing::warn!(leader = %addr, error = %e, "forwarding a path report to the analysis leader failed; kept here");
                None
            }
        }
    }

    /// One step of the findings with `step` (the tick; tests and tools drive the
    /// localizer with their own blames through it): `step` runs under the registry index
    /// read lock and the analyzer lock (that order, as everywhere), its changes are
    /// published before the analyzer lock is released, and stored after, with no lock of
    /// the index or the analyzer held during the store write. A failed write is logged
    /// and the findings are written again at the next step.
    pub fn step_findings(
        &self,
        step: impl FnOnce(&mut Analyzer, &RegistryIndex) -> Vec<FindingEvent>,
    ) -> Vec<FindingEvent> {
        let Some(analyzer) = &self.analyzer else {
            return Vec::new();
        };
        let events = {
            let idx = self.registry.index();
            let mut a = analyzer.lock().unwrap_or_else(|e| e.into_inner());
            let events = step(&mut a, &idx);
            for e in &events {
                // No subscriber is not an error.
                let _ = self.findings_tx.send(e.clone());
            }
            events
        };
        for e in &events {
            let Some(f) = &e.finding else { continue };
            let detail = f.evidence.as_ref().map_or("", |v| v.detail.as_str());
            macro_rules! log {
                ($level:ident) => {
                    tracing::$level!(
                        change = %e.change,
                        id = f.id,
                        kind = %f.kind,
                        location = %f.location,
                        symptom = %f.symptom,
                        confidence = f.confidence,
                        detail = %detail,
                        "finding"
                    )
                };
            }
            // An open finding is updated by every window that still blames it.
            if e.change == "updated" {
                log!(debug);
            } else {
                log!(info);
            }
        }
        self.persist_findings(&events);
        events
    }

    /// Writes the findings of `events` (and any a failed write left) to the store.
    pub(super) fn persist_findings(&self, events: &[FindingEvent]) {
        let mut unsaved = self
            .findings_unsaved
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for f in events.iter().filter_map(|e| e.finding.as_ref()) {
            unsaved.insert(f.id, f.clone());
        }
        if unsaved.is_empty() {
            return;
        }
        let batch: Vec<Finding> = unsaved.values().cloned().collect();
        match self.registry.save_findings(&batch) {
            Ok(()) => unsaved.clear(),
            Err(e) => {
                let mut given_up = 0;
                while unsaved.len() > UNSAVED_FINDINGS_CAP {
                    unsaved.pop_first();
                    given_up += 1;
                }
                tracing::error!(
                    error = %e,
                    pending = unsaved.len(),
                    given_up,
                    "storing findings failed; retrying at the next tick"
                );
            }
        }
    }

    /// Component findings: open ones (oldest first), then resolved ones (most recently
    /// resolved first, at most `resolved_limit`, 0 = all retained); `kind` "" = all.
    /// Unknown kinds are refused with the known ones named.
    pub fn findings(&self, resolved_limit: usize, kind: &str) -> Result<Vec<Finding>, Status> {
        check_finding_kind(kind)?;
        if !self.leadership.is_leader() {
            // A follower's analyzer is idle: the leader's findings are in the store.
            if let Some(a) = self.analyzer() {
                let mut l = Localizer::new(*a.localizer().params(), None);
                drop(a);
                l.restore(self.registry.load_findings().map_err(store_err)?);
                let mut list = l.list(resolved_limit, kind);
                self.annotate(&mut list);
                return Ok(list);
            }
        }
        let mut list = self
            .analyzer()
            .map(|a| a.localizer().list(resolved_limit, kind))
            .unwrap_or_default();
        self.annotate(&mut list);
        Ok(list)
    }

    /// Subscribes to finding changes and takes the snapshot under the analyzer lock, so
    /// the stream continues the snapshot exactly. The snapshot: every open finding and
    /// the [`WATCH_SNAPSHOT_RESOLVED`] most recently resolved, of `kind` ("" = all).
    pub fn watch_findings(
        &self,
        kind: &str,
    ) -> Result<(Vec<Finding>, broadcast::Receiver<FindingEvent>), Status> {
        check_finding_kind(kind)?;
        if !self.leadership.is_leader() {
            // A follower's findings do not move: only the leader's changes are live.
            return Err(Status::failed_precondition(
                match self.leadership.forward_to() {
                    Some(addr) => {
                        format!("this replica does not analyze; watch the leader at {addr}")
                    }
                    None => {
                        "this replica does not analyze and no leader is elected yet; retry".into()
                    }
                },
            ));
        }
        match self.analyzer() {
            Some(a) => {
                let rx = self.findings_tx.subscribe();
                let mut list = a.localizer().list(WATCH_SNAPSHOT_RESOLVED, kind);
                drop(a);
                self.annotate(&mut list);
                Ok((list, rx))
            }
            None => Ok((Vec::new(), self.findings_tx.subscribe())),
        }
    }

    /// Ends every WatchFindings stream (UNAVAILABLE) and refuses new ones: the server is
    /// shutting down.
    /// Turns true when the server stops.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    pub fn stop_watches(&self) {
        self.stopping.send_replace(true);
    }
}
