//! The driver's state machine between the transport and the sans-IO core: handling
//! event batches, sends and their completions, timers, pinglist changes and reports.

use super::*;

impl State {
    /// Handles a batch of events. When handling sent timed datagrams (first ACKs), their
    /// completions are usually queued already: take them now rather than after another
    /// trip through epoll. Err only for a fatal transport error.
    pub(super) fn handle_events(
        &mut self,
        ep: &Transport,
        events: &mut Vec<TransportEvent>,
    ) -> std::io::Result<()> {
        for _ in 0..DRAIN_ROUNDS {
            self.awaiting_completion = false;
            self.events_now_ns = monotonic_ns();
            for ev in events.drain(..) {
                self.on_event(ep, ev);
            }
            if !self.awaiting_completion {
                return Ok(());
            }
            match ep.poll_completions(events) {
                Err(e) if is_fatal_transport_error(&e) => return Err(e),
                Err(_) => break, // wait_events reports it
                Ok(()) if events.is_empty() => return Ok(()),
                Ok(()) => {}
            }
        }
        self.events_now_ns = monotonic_ns();
        for ev in events.drain(..) {
            self.on_event(ep, ev);
        }
        Ok(())
    }

    pub(super) fn send_due(&mut self, ep: &Transport, now: u64) {
        if !self.has_targets {
            return;
        }
        let mut batch = std::mem::take(&mut self.batch);
        for _ in 0..SEND_BURST {
            if self.prober.in_flight() >= self.p.max_in_flight {
                break;
            }
            let Some((_kind, id)) = self.scheduler.poll(now) else {
                break;
            };
            // Re-read the wall clock at most once a second: rotation periods are whole
            // seconds, so a boundary is seen within a second.
            if now >= self.label_epoch_until_ns {
                self.label_epoch = rotation_epoch(
                    realtime_ns() / 1_000_000_000,
                    self.p.flow_label_rotation_period_sec,
                );
                self.label_epoch_until_ns = now + 1_000_000_000;
            }
            let epoch = self.label_epoch;
            let Some(t) = self.targets.get_mut(&id) else {
                continue;
            };
            let flow_label = t.labels.next_label(epoch);
            let params = SendParams {
                flow_label,
                traffic_class: t.traffic_class,
                service_level: t.service_level,
            };
            let t1 = monotonic_ns();
            let pkt = self.prober.start_probe(id, flow_label, t1);
            bump(&self.stats.probes_sent);
            batch.datagrams.push((t.endpoint, params, pkt.encode()));
            batch.probes.push((id, pkt.sequence, t1));
        }
        if !batch.datagrams.is_empty() {
            ep.send_batch(&batch.datagrams, &mut batch.results);
            for (r, &(id, sequence, t1)) in batch.results.drain(..).zip(&batch.probes) {
                match r {
                    Ok(sid) => {
                        self.sends.insert(sid, SendPurpose::Probe(sequence), t1);
                    }
                    Err(e) => {
                        // The prober times it out; the reason is then send_error.
                        self.send_failed.insert(sequence);
                        let n = bump(&self.stats.send_errors) + 1;
                        if n.is_power_of_two() {
                            let target = self.targets.get(&id).map_or("?", |t| &t.spec.gid_text);
                            tracing::warn!(error = %e, target, send_errors = n, "probe send failed");
                        }
                    }
                }
            }
        }
        batch.datagrams.clear();
        batch.probes.clear();
        self.batch = batch;
    }

    /// Returns true when the housekeeping tick ran.
    pub(super) fn poll_timers(&mut self, now: u64) -> bool {
        let mut timeouts = std::mem::take(&mut self.timeouts);
        self.prober.poll_timeouts(now, &mut timeouts);
        for o in timeouts.drain(..) {
            self.finish(o);
        }
        self.timeouts = timeouts;
        let housekeeping = now >= self.next_housekeeping_ns;
        if housekeeping {
            self.next_housekeeping_ns = now + HOUSEKEEPING_NS;
            self.responder.expire(now);
            // Sends whose completion never came (e.g. a TX timestamp the kernel skipped).
            let horizon = self.p.probe_timeout_ns.saturating_mul(2);
            self.sends.expire(now, horizon);
            if self.send_failed.len() > 2 * self.p.max_in_flight.max(1024) {
                self.send_failed.clear();
            }
        }
        if now >= self.next_flush_ns {
            self.next_flush_ns = now + REPORT_FLUSH_NS;
            self.flush_reports(false);
        }
        housekeeping
    }

    /// When the driver must wake next. Probe timeouts and send times are rounded up to
    /// `TIMER_GRANULARITY_NS`: a timeout or a round a millisecond late is fine, while a
    /// timer re-armed per probe, or one firing every few microseconds while the next
    /// token accrues (a fast pace limited by its bucket), cost a syscall and a wake-up
    /// each (agent-bench's pipelined probes/s halved with exact send times).
    pub(super) fn next_deadline(&self, now: u64) -> u64 {
        let round_up =
            |t: u64| t.saturating_add(TIMER_GRANULARITY_NS - 1) & !(TIMER_GRANULARITY_NS - 1);
        let mut d = (self.next_housekeeping_ns + HOUSEKEEPING_NS / 2)
            .min(self.next_flush_ns + REPORT_FLUSH_NS / 2);
        if let Some(t) = self.prober.next_timeout() {
            d = d.min(round_up(t));
        }
        if self.has_targets && self.prober.in_flight() < self.p.max_in_flight {
            if let Some(t) = self.scheduler.next_wakeup_ns(now) {
                d = d.min(round_up(t));
            }
        }
        d
    }

    pub(super) fn on_event(&mut self, ep: &Transport, ev: TransportEvent) {
        match ev {
            TransportEvent::Received {
                from,
                len,
                data,
                rx_ts_ns,
                flow_label,
            } => {
                let pkt = match classify_datagram(len, &data) {
                    Ok(p) => p,
                    Err(reason) => {
                        self.metrics.record_dropped(reason);
                        let n = bump(&self.stats.dropped_malformed) + 1;
                        if n.is_power_of_two() {
                            tracing::debug!(reason = reason.as_str(), len, from = %from.gid, dropped = n, "malformed datagram dropped");
                        }
                        return;
                    }
                };
                let now = self.events_now_ns;
                match pkt.msg_type {
                    MsgType::Probe => {
                        let (pending, ack) = self.responder.on_probe(from, &pkt, rx_ts_ns, now);
                        bump(&self.stats.probes_answered);
                        // The ACKs take the probe's path: its flow label where the
                        // transport sees it (IPv6 GRH), as the Go responder does.
                        let label = flow_label.unwrap_or(0);
                        match ep.send(&from, &self.ack_params(label), &ack.encode()) {
                            Ok(sid) => {
                                self.sends
                                    .insert(sid, SendPurpose::FirstAck(pending, label), now);
                                self.awaiting_completion = true;
                            }
                            Err(e) => self.ack_send_failed(&e),
                        }
                    }
                    MsgType::Ack => {
                        // `now` is T6 when this is the second ACK.
                        if let Some(o) = self.prober.on_ack(&pkt, rx_ts_ns, now) {
                            self.finish(o);
                        }
                    }
                }
            }
            TransportEvent::Sent { id, tx_ts_ns } => match self.sends.remove(id) {
                Some(SendPurpose::Probe(seq)) => {
                    if let Some(o) = self.prober.on_probe_sent(seq, tx_ts_ns, self.events_now_ns) {
                        self.finish(o);
                    }
                }
                Some(SendPurpose::FirstAck(pending, label)) => {
                    if let Some((to, ack2)) = self.responder.on_first_ack_sent(pending, tx_ts_ns) {
                        // Nobody needs the second ACK's send time: no TX timestamp for it.
                        if let Err(e) =
                            ep.send_untimed(&to, &self.ack_params(label), &ack2.encode())
                        {
                            self.ack_send_failed(&e);
                        }
                    }
                }
                // Second ACKs are not tracked: their completion means nothing to us.
                None => {}
            },
            // Accepted, never sent (rdma: no address handle for the peer).
            TransportEvent::SendFailed { id } => match self.sends.remove(id) {
                Some(SendPurpose::Probe(seq)) => {
                    self.send_failed.insert(seq);
                    bump(&self.stats.send_errors);
                }
                Some(SendPurpose::FirstAck(..)) => {
                    self.ack_send_failed(&std::io::Error::other("first ACK was never sent"))
                }
                None => {}
            },
        }
    }

    pub(super) fn ack_params(&self, flow_label: u32) -> SendParams {
        SendParams {
            flow_label,
            traffic_class: self.p.traffic_class,
            service_level: self.p.service_level,
        }
    }

    pub(super) fn ack_send_failed(&self, e: &std::io::Error) {
        let n = bump(&self.stats.send_errors) + 1;
        if n.is_power_of_two() {
            tracing::warn!(error = %e, send_errors = n, "ACK send failed");
        }
    }

    pub(super) fn finish(&mut self, o: ProbeOutcome) {
        let send_failed = !self.send_failed.is_empty() && self.send_failed.remove(&o.sequence);
        let reason = fail_reason(&o.result, send_failed);
        // A target dropped from the pinglist since: its late result is not reported.
        let Some(t) = self.targets.get(&o.target) else {
            return;
        };
        if t.key.kind == PinglistKind::Host {
            // R2R is judged inside the host: no ToR-pair metrics, no summaries.
            let tap = |to: &Option<mpsc::UnboundedSender<TargetOutcome>>| {
                if let Some(tx) = to {
                    let _ = tx.send(TargetOutcome {
                        target_gid: t.key.gid.clone(),
                        target_qpn: t.key.qpn,
                        outcome: o,
                        fail_reason: reason,
                    });
                }
            };
            tap(&self.host_outcomes);
            tap(&self.outcomes);
            return;
        }
        match (&o.result, reason) {
            (ProbeResult::Success(s), _) => {
                bump(&self.stats.probe_success);
                self.metrics.record_success(&t.attrs, s);
            }
            (ProbeResult::Invalid(_), Some(r)) => {
                bump(&self.stats.probe_invalid);
                self.metrics.record_failure(&t.attrs, r);
            }
            (_, r) => {
                bump(&self.stats.probe_failed);
                self.metrics
                    .record_failure(&t.attrs, r.unwrap_or(FailReason::Timeout));
                if r == Some(FailReason::Timeout) && self.lost_paths.len() < MAX_LOST_PATHS {
                    self.lost_paths.push((
                        t.endpoint,
                        SendParams {
                            flow_label: o.flow_label,
                            traffic_class: t.traffic_class,
                            service_level: t.service_level,
                        },
                    ));
                }
            }
        }
        if let Some(agg) = &mut self.aggregator {
            // Inter-ToR windows are also counted per flow label: the controller votes
            // on ToR-spine links with them. An outcome counts in the window its probe was
            // sent in (T1, on the monotonic clock, moved to unix time): a timeout must
            // not spill a fault's loss into the next window, where it would be blamed on
            // whatever that window holds.
            let label = t.key.kind.labelled().then_some(o.flow_label);
            let now = realtime_ns();
            let age = o
                .timestamps
                .t1
                .map_or(0, |t1| monotonic_ns().saturating_sub(t1));
            agg.record_labelled(&t.key, &o.result, label, now.saturating_sub(age));
        }
        if let Some(tap) = &self.outcomes {
            let _ = tap.send(TargetOutcome {
                target_gid: t.key.gid.clone(),
                target_qpn: t.key.qpn,
                outcome: o,
                fail_reason: reason,
            });
        }
        // The Go agent's per-probe line: both GIDs, all six timestamps, the three
        // results (0 when invalid or lost). A cheap level check first: this is per probe.
        if tracing::enabled!(tracing::Level::DEBUG) && !matches!(o.result, ProbeResult::Lost) {
            let ts = &o.timestamps;
            let (valid, rtt, resp, prober) = match &o.result {
                ProbeResult::Success(s) => (
                    true,
                    s.network_rtt_ns,
                    s.responder_delay_ns,
                    s.prober_delay_ns,
                ),
                _ => (false, 0, 0, 0),
            };
            tracing::debug!(
                source_gid = %self.own_gid, target_gid = %t.spec.gid_text, seq = o.sequence,
                flow_label = o.flow_label,
                t1 = ts.t1.unwrap_or(0), t2 = ts.t2.unwrap_or(0), t3 = ts.t3.unwrap_or(0),
                t4 = ts.t4.unwrap_or(0), t5 = ts.t5.unwrap_or(0), t6 = ts.t6.unwrap_or(0),
                rtt_valid = valid, network_rtt_ns = rtt, responder_delay_ns = resp,
                prober_delay_ns = prober, reason = reason.map(|r| r.as_str()).unwrap_or(""),
                "Probe completed with all 6 timestamps"
            );
        }
    }

    /// Sends closed windows (all windows when `all`, at shutdown) to the report sink.
    pub(super) fn flush_reports(&mut self, all: bool) {
        let (Some(agg), Some(sink)) = (&mut self.aggregator, &self.reports) else {
            return;
        };
        let now = realtime_ns();
        let upto = if all {
            now.saturating_add(self.p.analysis_window_ns.unwrap_or(0))
        } else {
            // Outcomes count at their send time: a window is complete a probe timeout
            // after its end.
            now.saturating_sub(self.p.probe_timeout_ns)
        };
        for (key, w) in agg.take_closed(upto) {
            bump(&self.stats.summaries_offered);
            sink.offer(to_proto(&self.own_gid, &self.p.source_tor, &key, &w));
        }
    }

    /// Rebuilds the target table; targets that stay keep their id and flow-label position.
    /// The transport makes room for every path of the new lists.
    pub(super) fn apply_pinglists(&mut self, ep: &Transport, lists: &Pinglists, now: u64) {
        if self.p.responder_only {
            return;
        }
        ep.reserve_paths(path_count(lists));
        let mut keep: HashSet<TargetId> = HashSet::new();
        let mut by_kind: [Vec<TargetId>; 5] = Default::default();
        for kind in PinglistKind::ALL {
            for spec in lists.list(kind) {
                // Never probe ourselves, whatever the list says.
                if spec.gid == self.own.gid && spec.qpn == self.own.qpn {
                    continue;
                }
                let key = if kind == PinglistKind::Service {
                    (
                        spec.gid,
                        spec.qpn,
                        kind,
                        spec.flow_label,
                        spec.traffic_class,
                        spec.service_level,
                    )
                } else {
                    (spec.gid, spec.qpn, kind, 0, 0, 0)
                };
                let next_id = &mut self.next_id;
                let id = *self.ids.entry(key).or_insert_with(|| {
                    let id = *next_id;
                    *next_id = next_id.wrapping_add(1);
                    id
                });
                if !keep.insert(id) {
                    continue; // listed twice
                }
                let fresh = match self.targets.get(&id) {
                    Some(t) => t.spec != *spec,
                    None => true,
                };
                if fresh {
                    self.targets.insert(id, self.target_state(spec));
                }
                by_kind[kind as usize].push(id);
            }
        }
        self.targets.retain(|id, _| keep.contains(id));
        self.ids.retain(|_, id| keep.contains(id));
        self.has_targets = !keep.is_empty();
        let [tor_mesh, inter_tor, service, focus, host] = by_kind;
        tracing::info!(
            gid = %self.own_gid, tor_mesh = tor_mesh.len(), inter_tor = inter_tor.len(),
            service = service.len(), focus = focus.len(), host = host.len(), "probe targets set"
        );
        self.kind_targets = [tor_mesh, inter_tor, service, focus, host];
        self.applied_multiplier_bits = self.current_multiplier_bits();
        self.apply_rates(now);
    }

    pub(super) fn current_multiplier_bits(&self) -> u64 {
        self.p
            .rate_multiplier
            .as_ref()
            .map_or(1.0f64.to_bits(), |m| m.bits())
    }

    /// Re-applies the targets' rates when the self-protection multiplier moved: one
    /// relaxed load per turn, work only on a change (at most once per watchdog interval).
    pub(super) fn follow_multiplier(&mut self, now: u64) {
        if self.p.rate_multiplier.is_none() || self.p.responder_only {
            return;
        }
        let bits = self.current_multiplier_bits();
        if bits != self.applied_multiplier_bits {
            self.applied_multiplier_bits = bits;
            self.apply_rates(now);
        }
    }

    /// Hands the scheduler every kind's targets at its rate x the applied multiplier.
    pub(super) fn apply_rates(&mut self, now: u64) {
        let m = f64::from_bits(self.applied_multiplier_bits);
        let [tor_mesh_rate, inter_tor_rate, service_rate, focus_rate, host_rate] =
            self.p.scaled_rates(m);
        let [tor_mesh, inter_tor, service, focus, host] = &self.kind_targets;
        // FOCUS targets are due every 1/rate s, not once per round: the point is more
        // probes through one component, for a while.
        self.scheduler.set_targets_every(
            PinglistKind::Focus,
            focus.clone(),
            focus_rate,
            focus_round_ns(focus_rate),
            now,
        );
        self.scheduler.set_targets_every(
            PinglistKind::Host,
            host.clone(),
            host_rate,
            self.p.host_round_ns,
            now,
        );
        self.scheduler
            .set_targets(PinglistKind::Service, service.clone(), service_rate, now);
        self.scheduler
            .set_targets(PinglistKind::TorMesh, tor_mesh.clone(), tor_mesh_rate, now);
        self.scheduler.set_targets(
            PinglistKind::InterTor,
            inter_tor.clone(),
            inter_tor_rate,
            now,
        );
    }

    pub(super) fn target_state(&self, spec: &ProbeTarget) -> TargetState {
        let service = spec.kind == PinglistKind::Service;
        // SERVICE: exactly the service's label (no set, no rotation) and its TC/SL when
        // the controller gave them; otherwise the configured ones.
        let labels = if service {
            FlowLabelSet::new(0, 1, spec.flow_label)
        } else if spec.kind == PinglistKind::Focus {
            FlowLabelSet::explicit(&spec.flow_labels)
        } else {
            FlowLabelSet::new(spec.flow_label_seed, spec.flow_label_count, spec.flow_label)
        };
        let pick = |from_target: u8, configured: u8| {
            if service && from_target != 0 {
                from_target
            } else {
                configured
            }
        };
        let attrs = if service {
            let name = self
                .p
                .service_names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .attribute(&spec.service);
            PathAttrs::with_service(&self.p.source_tor, &spec.tor_id, &name)
        } else {
            PathAttrs::new(&self.p.source_tor, &spec.tor_id)
        };
        if spec.kind != PinglistKind::Host {
            self.metrics.init_path(&attrs);
        }
        TargetState {
            endpoint: Endpoint {
                gid: spec.gid,
                qpn: spec.qpn,
            },
            labels,
            traffic_class: pick(spec.traffic_class, self.p.traffic_class),
            service_level: pick(spec.service_level, self.p.service_level),
            attrs,
            key: PathKey {
                gid: spec.gid_text.as_str().into(),
                tor: spec.tor_id.as_str().into(),
                qpn: spec.qpn,
                kind: spec.kind,
                service: spec.service.as_str().into(),
            },
            spec: spec.clone(),
        }
    }
}
