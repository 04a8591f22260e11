//! Which replica does the work that must happen once: analysis and the finding state.
//!
//! With SQLite there is one controller and it leads. With etcd every replica campaigns
//! in one etcd election ([`ETCD_ELECTION`]) under a lease of `leader_lease_ttl_sec`,
//! with its advertised address as the value: the winner analyzes; the others forward
//! agents' path reports to it and answer finding queries from the store. A leader that
//! dies stops keeping its lease alive, etcd deletes its candidacy when the lease runs
//! out, and the next candidate wins: a takeover within one TTL.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::sync::watch;

use crate::registry::ETCD_ELECTION;

/// What this replica knows of the leadership.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaderView {
    /// This replica leads.
    pub me: bool,
    /// The leader's advertised address, when known.
    pub leader_addr: Option<String>,
}

/// The leadership as the services see it.
pub struct Leadership {
    view: watch::Sender<LeaderView>,
}

impl Leadership {
    /// The only controller: it leads.
    pub fn solo() -> Self {
        Leadership {
            view: watch::Sender::new(LeaderView {
                me: true,
                leader_addr: None,
            }),
        }
    }

    /// A replica that has not won an election (yet).
    pub fn follower() -> Self {
        Leadership {
            view: watch::Sender::new(LeaderView::default()),
        }
    }

    pub fn is_leader(&self) -> bool {
        self.view.borrow().me
    }

    /// The leader to forward to: None when this replica leads or none is known.
    pub fn forward_to(&self) -> Option<String> {
        let v = self.view.borrow();
        (!v.me).then(|| v.leader_addr.clone()).flatten()
    }

    pub fn view(&self) -> LeaderView {
        self.view.borrow().clone()
    }

    fn set(&self, v: LeaderView) {
        self.view.send_if_modified(|old| {
            let changed = *old != v;
            *old = v;
            changed
        });
    }
}

/// Campaigns until shutdown: leads while its lease lives, and campaigns again with a
/// new lease when it is lost (etcd unreachable for a TTL). `me` is the advertised address.
pub async fn run_election(
    endpoints: Vec<String>,
    me: String,
    ttl_sec: u64,
    lead: std::sync::Arc<Leadership>,
    mut shutdown: watch::Receiver<bool>,
) {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(ttl_sec.max(2)));
    let mut client = loop {
        match Client::connect(&endpoints, Some(opts.clone())).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, "leader election: cannot reach etcd; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
            }
        }
    };
    loop {
        let lease = match client.lease_grant(ttl_sec as i64, None).await {
            Ok(r) => r.id(),
            Err(e) => {
                tracing::warn!(error = %e, "leader election: no lease; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
                continue;
            }
        };
        let elected = tokio::select! {
            e = campaign(client.clone(), lease, &me, &lead) => Some(e),
            _ = keep_alive(client.clone(), lease, ttl_sec) => Some(false),
            _ = shutdown.wait_for(|s| *s) => None,
        };
        let Some(elected) = elected else {
            let _ = client.lease_revoke(lease).await;
            return;
        };
        if !elected {
            tracing::warn!("leader election: this replica's lease ran out while campaigning");
            continue;
        }
        tracing::info!(addr = %me, "this replica is now the analysis leader");
        lead.set(LeaderView {
            me: true,
            leader_addr: Some(me.clone()),
        });
        let lost = tokio::select! {
            _ = keep_alive(client.clone(), lease, ttl_sec) => true,
            _ = shutdown.wait_for(|s| *s) => false,
        };
        lead.set(LeaderView::default());
        if !lost {
            // Hands over at once instead of one TTL later.
            let _ = client.lease_revoke(lease).await;
            return;
        }
        tracing::warn!(
            "leader election: the lease was lost; analysis stops here until elected again"
        );
    }
}

/// Campaigns (each call bounded by the client's timeout, so it is repeated) and, while
/// waiting, follows who leads. True once elected.
async fn campaign(mut client: Client, lease: i64, me: &str, lead: &Leadership) -> bool {
    let mut watcher = client.clone();
    let follow = async {
        loop {
            if let Ok(r) = watcher.leader(ETCD_ELECTION).await {
                let addr = r
                    .kv()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
                if addr.as_deref() != Some(me) {
                    lead.set(LeaderView {
                        me: false,
                        leader_addr: addr,
                    });
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let win = async {
        loop {
            match client.campaign(ETCD_ELECTION, me, lease).await {
                Ok(_) => return true,
                Err(e) => {
                    tracing::debug!(error = %e, "campaign call ended; campaigning again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    };
    tokio::select! {
        w = win => w,
        _ = follow => false,
    }
}

/// Keeps `lease` alive every third of its TTL; returns when it is lost (expired, or not
/// renewed for a whole TTL).
async fn keep_alive(mut client: Client, lease: i64, ttl_sec: u64) {
    let every = Duration::from_millis(ttl_sec * 1000 / 3);
    let ttl = Duration::from_secs(ttl_sec);
    let mut last_ok = tokio::time::Instant::now();
    loop {
        let renewed = async {
            let (mut keeper, mut stream) = client.lease_keep_alive(lease).await.ok()?;
            keeper.keep_alive().await.ok()?;
            let r = stream.message().await.ok()??;
            Some(r.ttl() > 0)
        };
        match tokio::time::timeout(every, renewed).await {
            Ok(Some(true)) => last_ok = tokio::time::Instant::now(),
            // etcd says the lease is gone.
            Ok(Some(false)) => return,
            _ => {
                if last_ok.elapsed() >= ttl {
                    return;
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}
