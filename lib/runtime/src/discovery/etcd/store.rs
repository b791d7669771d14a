//! The etcd connection: bounded requests with errors that name the endpoints, and the
//! lease operations the shared [`LeaseKeeper`](super::super::lease::LeaseKeeper) drives.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::timeout;

use crate::discovery::lease::LeaseStore;
use crate::error::{Error, ErrorKind, Result};

/// Bound on one etcd request, so a partitioned etcd fails callers instead of hanging them.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on revoking a lease: a dead etcd must not stall process exit (the lease then
/// simply expires after its TTL).
const REVOKE_TIMEOUT: Duration = Duration::from_secs(3);

/// An open keep-alive stream for one lease; reused across renewals.
struct KeepAlive {
    lease: i64,
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
}

/// An etcd client with this process's lease settings: the store of [`super::EtcdDiscovery`].
pub struct EtcdStore {
    pub(super) client: Client,
    /// The endpoints, joined, for log and error messages.
    pub(super) endpoints: String,
    /// Lease TTL, whole seconds.
    pub(super) ttl: Duration,
    keep_alive: AsyncMutex<Option<KeepAlive>>,
}

/// Whether etcd said that the lease does not exist (expired or revoked).
fn lease_not_found(e: &etcd_client::Error) -> bool {
    // The keep-alive opener says "lease not found"; the server "requested lease not found".
    e.to_string().contains("lease not found")
}

impl EtcdStore {
    pub(super) fn new(client: Client, endpoints: String, ttl: Duration) -> Self {
        EtcdStore { client, endpoints, ttl, keep_alive: AsyncMutex::new(None) }
    }

    /// Run one etcd call under [`REQUEST_TIMEOUT`], turning failures into `Discovery`
    /// errors that name the operation and the endpoints.
    pub(super) async fn request<T>(
        &self,
        what: &str,
        call: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match timeout(REQUEST_TIMEOUT, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.error(what, e)),
            Err(_) => Err(Error::new(
                ErrorKind::Discovery,
                format!(
                    "etcd {what} got no answer within {REQUEST_TIMEOUT:?} ({})",
                    self.endpoints
                ),
            )),
        }
    }

    fn error(&self, what: &str, e: etcd_client::Error) -> Error {
        Error::with_source(
            ErrorKind::Discovery,
            format!("etcd {what} failed ({}): {e}", self.endpoints),
            e,
        )
    }

    async fn txn(&self, txn: Txn) -> Result<bool> {
        let mut kv = self.client.kv_client();
        Ok(self.request("transaction", kv.txn(txn)).await?.succeeded())
    }
}

pub(super) fn ttl_seconds(ttl: Duration) -> i64 {
    // etcd TTLs are whole seconds; round up so the lease never lives shorter than asked.
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

#[async_trait]
impl LeaseStore for EtcdStore {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn location(&self) -> String {
        self.endpoints.clone()
    }

    async fn renew(&self, lease: i64) -> Result<bool> {
        let mut slot = self.keep_alive.lock().await;
        // Taken out and put back only after a good answer: a failure, or this future
        // dropped by a timeout, leaves no half-used stream behind, and the next renewal
        // opens a fresh one (also after etcd restarted).
        let open = slot.take().filter(|k| k.lease == lease);
        let Some(mut conn) = open else {
            let mut lease_client = self.client.lease_client();
            return match lease_client.keep_alive(lease).await {
                // Opening the stream renewed the lease once.
                Ok((keeper, answers)) => {
                    *slot = Some(KeepAlive { lease, keeper, answers });
                    Ok(true)
                }
                Err(e) if lease_not_found(&e) => Ok(false),
                Err(e) => Err(self.error("keep-alive", e)),
            };
        };
        conn.keeper.keep_alive().await.map_err(|e| self.error("keep-alive", e))?;
        match conn.answers.message().await {
            Ok(Some(answer)) if answer.ttl() > 0 => {
                *slot = Some(conn);
                Ok(true)
            }
            Ok(Some(_)) => Ok(false),
            Ok(None) => Err(Error::new(
                ErrorKind::Discovery,
                format!("etcd closed the keep-alive stream ({})", self.endpoints),
            )),
            Err(e) if lease_not_found(&e) => Ok(false),
            Err(e) => Err(self.error("keep-alive", e)),
        }
    }

    async fn grant(&self) -> Result<i64> {
        let mut lease_client = self.client.lease_client();
        let granted =
            self.request("lease grant", lease_client.grant(ttl_seconds(self.ttl), None)).await?;
        Ok(granted.id())
    }

    async fn write(
        &self,
        key: &str,
        value: &Bytes,
        lease: i64,
        exclusive: bool,
        ours: &[i64],
    ) -> Result<bool> {
        let put = || TxnOp::put(key, value.to_vec(), Some(PutOptions::new().with_lease(lease)));
        let unchanged = || {
            [
                Compare::lease(key, CompareOp::Equal, lease),
                Compare::value(key, CompareOp::Equal, value.to_vec()),
            ]
        };
        if !exclusive {
            self.txn(Txn::new().when(unchanged()).or_else([put()])).await?;
            return Ok(true);
        }
        if ours.contains(&lease) && self.txn(Txn::new().when(unchanged())).await? {
            return Ok(true);
        }
        for &old in ours {
            let txn =
                Txn::new().when([Compare::lease(key, CompareOp::Equal, old)]).and_then([put()]);
            if self.txn(txn).await? {
                return Ok(true);
            }
        }
        let txn =
            Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([put()]);
        self.txn(txn).await
    }

    async fn abandon(&self, lease: i64) {
        {
            let mut slot = self.keep_alive.lock().await;
            if slot.as_ref().is_some_and(|k| k.lease == lease) {
                *slot = None;
            }
        }
        let mut lease_client = self.client.lease_client();
        match timeout(REVOKE_TIMEOUT, lease_client.revoke(lease)).await {
            Ok(Ok(_)) => tracing::debug!(lease, "etcd lease revoked"),
            Ok(Err(e)) if lease_not_found(&e) => tracing::debug!(lease, "etcd lease already gone"),
            Ok(Err(e)) => {
                tracing::warn!(lease, error = %e, "revoking the etcd lease failed; it expires after its TTL")
            }
            Err(_) => tracing::warn!(
                lease,
                "revoking the etcd lease got no answer within {REVOKE_TIMEOUT:?}; it expires after its TTL"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_secs(2)), 2);
        assert_eq!(ttl_seconds(Duration::from_millis(2500)), 3);
        assert_eq!(ttl_seconds(Duration::ZERO), 1);
    }
}
