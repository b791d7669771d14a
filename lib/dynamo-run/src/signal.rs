//! Shutdown on SIGINT (Ctrl-C) or SIGTERM.

use tokio_util::sync::CancellationToken;

/// Resolve when the process receives SIGINT or SIGTERM. A handler that cannot be
/// installed is logged and never fires.
pub async fn shutdown_signal() {
    let interrupt = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
    }
}

/// A token cancelled on SIGINT/SIGTERM, and the task that watches for them (owned by
/// the caller, which aborts it when the run ends).
pub fn cancel_on_signal() -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let fire = cancel.clone();
    let task = tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("signal received; shutting down");
        fire.cancel();
    });
    (cancel, task)
}
