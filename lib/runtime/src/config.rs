//! Runtime configuration: defaults, then environment variables, then explicit overrides.
//!
//! Every key is documented in `docs/configuration.md`; a malformed value is an error
//! naming the variable, never a silent default.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// Where instances, model cards and small config keys are registered and watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryBackend {
    /// etcd, with one lease per process and prefix watches.
    Etcd,
    /// A directory shared by the processes of one machine; liveness by heartbeat.
    File,
    /// In-process only (tests, single-process deployments).
    Mem,
}

/// How a request reaches the chosen instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestPlane {
    /// Direct TCP to the address the instance registered (responses come back on it).
    Tcp,
    /// NATS request/reply on a per-instance subject; responses on a TCP stream back.
    Nats,
}

/// How events (KV events, load metrics) are published and subscribed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventPlane {
    /// Publisher sockets found through discovery.
    Tcp,
    /// NATS core pub/sub.
    Nats,
}

/// What a process does when discovery tells it its lease is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseLossPolicy {
    /// Keep serving and retry for as long as the process lives: keep the old lease if the
    /// store still has it, else take a new one and write every registration again
    /// (instance ids stay the same).
    Reregister,
    /// Cancel the runtime: the process shuts down.
    Shutdown,
}

macro_rules! parse_enum {
    ($ty:ty, $($name:literal => $val:expr),+ $(,)?) => {
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $($name => Ok($val),)+
                    other => Err(format!(
                        "'{other}' is not one of: {}", [$($name),+].join(", ")
                    )),
                }
            }
        }
        impl $ty {
            /// The name used in configuration.
            pub fn as_str(&self) -> &'static str {
                $(if *self == $val { return $name; })+
                unreachable!()
            }
        }
    };
}

parse_enum!(DiscoveryBackend, "etcd" => DiscoveryBackend::Etcd, "file" => DiscoveryBackend::File, "mem" => DiscoveryBackend::Mem);
parse_enum!(RequestPlane, "tcp" => RequestPlane::Tcp, "nats" => RequestPlane::Nats);
parse_enum!(EventPlane, "tcp" => EventPlane::Tcp, "nats" => EventPlane::Nats);
parse_enum!(LeaseLossPolicy, "reregister" => LeaseLossPolicy::Reregister, "shutdown" => LeaseLossPolicy::Shutdown);

/// Everything a [`crate::DistributedRuntime`] needs to know to start.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// `DYN_DISCOVERY_BACKEND` (default `file`).
    pub discovery: DiscoveryBackend,
    /// `DYN_REQUEST_PLANE` (default `tcp`).
    pub request_plane: RequestPlane,
    /// `DYN_EVENT_PLANE` (default `tcp`).
    pub event_plane: EventPlane,
    /// `ETCD_ENDPOINTS`, comma separated (default `http://localhost:2379`).
    pub etcd_endpoints: Vec<String>,
    /// `NATS_SERVER` (default `nats://localhost:4222`).
    pub nats_server: String,
    /// `DYN_FILE_KV`: the directory of the `file` backend (default `$TMPDIR/dynamo-kv`).
    pub file_kv_dir: PathBuf,
    /// `DYN_LEASE_TTL` seconds: etcd lease TTL and `file` heartbeat expiry (default 10).
    pub lease_ttl: Duration,
    /// `DYN_LEASE_LOSS`: `reregister` (default) or `shutdown`.
    pub lease_loss: LeaseLossPolicy,
    /// `DYN_TCP_HOST`: address to bind and advertise (default: 127.0.0.1 for the
    /// embedded backends, the first non-loopback address for etcd).
    pub tcp_host: Option<String>,
    /// `DYN_TCP_PORT` (default 0: any free port).
    pub tcp_port: u16,
    /// `DYN_TCP_MAX_MESSAGE_SIZE` bytes: the largest frame on the TCP planes (default 64 MiB).
    pub max_message_size: usize,
    /// `DYN_CONNECT_TIMEOUT` seconds: bound on opening a TCP connection (default 5).
    pub connect_timeout: Duration,
    /// `DYN_RESPONSE_TIMEOUT` seconds: NATS plane, bound on a worker taking a request
    /// (connecting back with its Start frame) (default 10).
    pub response_timeout: Duration,
    /// `DYN_SHUTDOWN_TIMEOUT` seconds: bound on draining in-flight streams (default 30).
    pub shutdown_timeout: Duration,
    /// `DYN_TCP_PING_INTERVAL` seconds: a TCP connection quiet for this long is pinged (default 2).
    pub tcp_ping_interval: Duration,
    /// `DYN_TCP_PEER_TIMEOUT` seconds: a TCP connection that hears nothing from its peer
    /// for this long is declared dead (default 6).
    pub tcp_peer_timeout: Duration,
    /// `DYN_STREAM_FIRST_ITEM_TIMEOUT` seconds: bound on waiting for a response stream's
    /// first item; `None` (0 in the environment) waits forever (default 300).
    pub stream_first_item_timeout: Option<Duration>,
    /// `DYN_STREAM_ITEM_TIMEOUT` seconds: bound on the gap between two items of a response
    /// stream; `None` (0 in the environment) waits forever (default 120).
    pub stream_item_timeout: Option<Duration>,
    /// `DYN_DISCOVERY_HEALTH_GRACE` seconds: how long discovery may be degraded (store
    /// unreachable, lease lost) before `/health` says unhealthy; meanwhile the process
    /// serves on what it last knew (default 30).
    pub discovery_health_grace: Duration,
    /// `DYN_SYSTEM_ENABLED`: serve `/health`, `/live`, `/metrics` (default false).
    pub system_enabled: bool,
    /// `DYN_SYSTEM_HOST` (default 0.0.0.0).
    pub system_host: String,
    /// `DYN_SYSTEM_PORT` (default 9090; 0 picks a free port).
    pub system_port: u16,
    /// `DYN_SYSTEM_PORT_FILE`: once the system server is bound, its port is written to
    /// this file (written aside, then renamed into place), so whoever started the process
    /// can let it pick a free port (`DYN_SYSTEM_PORT=0`) and still find it (default none).
    pub system_port_file: Option<PathBuf>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            discovery: DiscoveryBackend::File,
            request_plane: RequestPlane::Tcp,
            event_plane: EventPlane::Tcp,
            etcd_endpoints: vec!["http://localhost:2379".to_string()],
            nats_server: "nats://localhost:4222".to_string(),
            file_kv_dir: std::env::temp_dir().join("dynamo-kv"),
            lease_ttl: Duration::from_secs(10),
            lease_loss: LeaseLossPolicy::Reregister,
            tcp_host: None,
            tcp_port: 0,
            max_message_size: 64 * 1024 * 1024,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            tcp_ping_interval: Duration::from_secs(2),
            tcp_peer_timeout: Duration::from_secs(6),
            stream_first_item_timeout: Some(Duration::from_secs(300)),
            stream_item_timeout: Some(Duration::from_secs(120)),
            discovery_health_grace: Duration::from_secs(30),
            system_enabled: false,
            system_host: "0.0.0.0".to_string(),
            system_port: 9090,
            system_port_file: None,
        }
    }
}

fn parse_value<T: FromStr>(key: &str, raw: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    raw.trim().parse::<T>().map_err(|e| {
        Error::new(ErrorKind::Config, format!("invalid value for {key}: '{raw}' ({e})"))
    })
}

fn parse_seconds(key: &str, raw: &str) -> Result<Duration> {
    let secs: f64 = parse_value(key, raw)?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(Error::new(
            ErrorKind::Config,
            format!("invalid value for {key}: '{raw}' (must be a positive number of seconds)"),
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Seconds where 0 means "no bound".
fn parse_optional_seconds(key: &str, raw: &str) -> Result<Option<Duration>> {
    let secs: f64 = parse_value(key, raw)?;
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(Error::new(
            ErrorKind::Config,
            format!("invalid value for {key}: '{raw}' (must be a number of seconds, 0 for no bound)"),
        ));
    }
    Ok((secs > 0.0).then(|| Duration::from_secs_f64(secs)))
}

fn parse_bool(key: &str, raw: &str) -> Result<bool> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(Error::new(
            ErrorKind::Config,
            format!("invalid value for {key}: '{raw}' (expected true or false)"),
        )),
    }
}

impl RuntimeConfig {
    /// Defaults overridden by the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Defaults overridden by `lookup` (the environment, or a map in tests).
    /// Empty values count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = RuntimeConfig::default();
        let get = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        if let Some(v) = get("DYN_DISCOVERY_BACKEND") {
            c.discovery = parse_value("DYN_DISCOVERY_BACKEND", &v)?;
        }
        if let Some(v) = get("DYN_REQUEST_PLANE") {
            c.request_plane = parse_value("DYN_REQUEST_PLANE", &v)?;
        }
        if let Some(v) = get("DYN_EVENT_PLANE") {
            c.event_plane = parse_value("DYN_EVENT_PLANE", &v)?;
        }
        if let Some(v) = get("ETCD_ENDPOINTS") {
            c.etcd_endpoints =
                v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        }
        if let Some(v) = get("NATS_SERVER") {
            c.nats_server = v.trim().to_string();
        }
        if let Some(v) = get("DYN_FILE_KV") {
            c.file_kv_dir = PathBuf::from(v);
        }
        if let Some(v) = get("DYN_LEASE_TTL") {
            c.lease_ttl = parse_seconds("DYN_LEASE_TTL", &v)?;
        }
        if let Some(v) = get("DYN_LEASE_LOSS") {
            c.lease_loss = parse_value("DYN_LEASE_LOSS", &v)?;
        }
        if let Some(v) = get("DYN_TCP_HOST") {
            c.tcp_host = Some(v.trim().to_string());
        }
        if let Some(v) = get("DYN_TCP_PORT") {
            c.tcp_port = parse_value("DYN_TCP_PORT", &v)?;
        }
        if let Some(v) = get("DYN_TCP_MAX_MESSAGE_SIZE") {
            c.max_message_size = parse_value("DYN_TCP_MAX_MESSAGE_SIZE", &v)?;
        }
        if let Some(v) = get("DYN_CONNECT_TIMEOUT") {
            c.connect_timeout = parse_seconds("DYN_CONNECT_TIMEOUT", &v)?;
        }
        if let Some(v) = get("DYN_RESPONSE_TIMEOUT") {
            c.response_timeout = parse_seconds("DYN_RESPONSE_TIMEOUT", &v)?;
        }
        if let Some(v) = get("DYN_SHUTDOWN_TIMEOUT") {
            c.shutdown_timeout = parse_seconds("DYN_SHUTDOWN_TIMEOUT", &v)?;
        }
        if let Some(v) = get("DYN_TCP_PING_INTERVAL") {
            c.tcp_ping_interval = parse_seconds("DYN_TCP_PING_INTERVAL", &v)?;
        }
        if let Some(v) = get("DYN_TCP_PEER_TIMEOUT") {
            c.tcp_peer_timeout = parse_seconds("DYN_TCP_PEER_TIMEOUT", &v)?;
        }
        if let Some(v) = get("DYN_STREAM_FIRST_ITEM_TIMEOUT") {
            c.stream_first_item_timeout = parse_optional_seconds("DYN_STREAM_FIRST_ITEM_TIMEOUT", &v)?;
        }
        if let Some(v) = get("DYN_STREAM_ITEM_TIMEOUT") {
            c.stream_item_timeout = parse_optional_seconds("DYN_STREAM_ITEM_TIMEOUT", &v)?;
        }
        if let Some(v) = get("DYN_DISCOVERY_HEALTH_GRACE") {
            c.discovery_health_grace = parse_seconds("DYN_DISCOVERY_HEALTH_GRACE", &v)?;
        }
        if let Some(v) = get("DYN_SYSTEM_ENABLED") {
            c.system_enabled = parse_bool("DYN_SYSTEM_ENABLED", &v)?;
        }
        if let Some(v) = get("DYN_SYSTEM_HOST") {
            c.system_host = v.trim().to_string();
        }
        if let Some(v) = get("DYN_SYSTEM_PORT") {
            c.system_port = parse_value("DYN_SYSTEM_PORT", &v)?;
        }
        if let Some(v) = get("DYN_SYSTEM_PORT_FILE") {
            let v = v.trim();
            c.system_port_file = (!v.is_empty()).then(|| PathBuf::from(v));
        }
        c.validate()?;
        Ok(c)
    }

    /// Check values that are individually well-formed but unusable.
    pub fn validate(&self) -> Result<()> {
        if self.discovery == DiscoveryBackend::Etcd && self.etcd_endpoints.is_empty() {
            return Err(Error::new(ErrorKind::Config, "ETCD_ENDPOINTS is empty"));
        }
        let uses_nats =
            self.request_plane == RequestPlane::Nats || self.event_plane == EventPlane::Nats;
        if uses_nats && !self.nats_server.starts_with("nats://") {
            return Err(Error::new(
                ErrorKind::Config,
                format!("NATS_SERVER must start with nats:// (got '{}')", self.nats_server),
            ));
        }
        if self.max_message_size < 1024 {
            return Err(Error::new(
                ErrorKind::Config,
                "DYN_TCP_MAX_MESSAGE_SIZE must be at least 1024 bytes",
            ));
        }
        if self.tcp_peer_timeout <= self.tcp_ping_interval {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "DYN_TCP_PEER_TIMEOUT ({:?}) must be longer than DYN_TCP_PING_INTERVAL ({:?})",
                    self.tcp_peer_timeout, self.tcp_ping_interval
                ),
            ));
        }
        Ok(())
    }

    /// Whether this configuration needs a NATS connection.
    pub fn needs_nats(&self) -> bool {
        self.request_plane == RequestPlane::Nats || self.event_plane == EventPlane::Nats
    }

    /// The host the TCP server binds to and advertises.
    pub fn resolved_tcp_host(&self) -> String {
        if let Some(h) = &self.tcp_host {
            return h.clone();
        }
        match self.discovery {
            DiscoveryBackend::Etcd => local_ip_address::local_ip()
                .map(|ip| ip.to_string())
                .unwrap_or_else(|_| "127.0.0.1".to_string()),
            DiscoveryBackend::File | DiscoveryBackend::Mem => "127.0.0.1".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(pairs: &[(&str, &str)]) -> Result<RuntimeConfig> {
        let map: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RuntimeConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_are_embedded() {
        let c = from(&[]).unwrap();
        assert_eq!(c.discovery, DiscoveryBackend::File);
        assert_eq!(c.request_plane, RequestPlane::Tcp);
        assert_eq!(c.event_plane, EventPlane::Tcp);
        assert!(!c.needs_nats());
        assert_eq!(c.resolved_tcp_host(), "127.0.0.1");
    }

    #[test]
    fn environment_overrides() {
        let c = from(&[
            ("DYN_DISCOVERY_BACKEND", "ETCD"),
            ("DYN_REQUEST_PLANE", "nats"),
            ("ETCD_ENDPOINTS", "http://a:1, http://b:2"),
            ("DYN_LEASE_TTL", "2.5"),
            ("DYN_SYSTEM_ENABLED", "true"),
        ])
        .unwrap();
        assert_eq!(c.discovery, DiscoveryBackend::Etcd);
        assert_eq!(c.request_plane, RequestPlane::Nats);
        assert_eq!(c.etcd_endpoints, vec!["http://a:1", "http://b:2"]);
        assert_eq!(c.lease_ttl, Duration::from_millis(2500));
        assert!(c.system_enabled);
    }

    #[test]
    fn stream_bounds_zero_disables() {
        let c = from(&[("DYN_STREAM_FIRST_ITEM_TIMEOUT", "0"), ("DYN_STREAM_ITEM_TIMEOUT", "1.5")]).unwrap();
        assert_eq!(c.stream_first_item_timeout, None);
        assert_eq!(c.stream_item_timeout, Some(Duration::from_millis(1500)));
        let d = from(&[]).unwrap();
        assert_eq!(d.stream_first_item_timeout, Some(Duration::from_secs(300)));
        assert_eq!(d.tcp_peer_timeout, Duration::from_secs(6));
        assert_eq!(d.discovery_health_grace, Duration::from_secs(30));
        let e = from(&[("DYN_DISCOVERY_HEALTH_GRACE", "soon")]).unwrap_err();
        assert!(e.to_string().contains("DYN_DISCOVERY_HEALTH_GRACE"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = from(&[("DYN_REQUEST_PLANE", "carrier-pigeon")]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.to_string().contains("DYN_REQUEST_PLANE"), "{e}");
        assert!(e.to_string().contains("tcp, nats"), "{e}");
        let e = from(&[("DYN_LEASE_TTL", "-1")]).unwrap_err();
        assert!(e.to_string().contains("DYN_LEASE_TTL"), "{e}");
        let e = from(&[("DYN_EVENT_PLANE", "nats"), ("NATS_SERVER", "localhost:4222")]).unwrap_err();
        assert!(e.to_string().contains("nats://"), "{e}");
        let e = from(&[("DYN_TCP_PING_INTERVAL", "5"), ("DYN_TCP_PEER_TIMEOUT", "4")]).unwrap_err();
        assert!(e.to_string().contains("DYN_TCP_PEER_TIMEOUT"), "{e}");
        let e = from(&[("DYN_STREAM_ITEM_TIMEOUT", "-2")]).unwrap_err();
        assert!(e.to_string().contains("DYN_STREAM_ITEM_TIMEOUT"), "{e}");
        let e = from(&[("DYN_SYSTEM_PORT", "http")]).unwrap_err();
        assert!(e.to_string().contains("DYN_SYSTEM_PORT"), "{e}");
    }
}
