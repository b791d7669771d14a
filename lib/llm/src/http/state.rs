//! `AppState`: what every HTTP handler and layer reads. Its own file, so that the
//! handlers (`openai`, `health`, `layers`) and `service`, which routes to them, both
//! import it and neither imports the other's side.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use super::limits::HttpLimits;
use super::metrics::HttpMetrics;
use super::responses::background::BackgroundCancels;
use super::responses::SharedResponseStore;
use super::streams::StreamRegistry;
use crate::model_manager::ModelManager;

/// A check of what the service depends on besides its models (discovery, the planes):
/// `Err(reason)` makes `/health` answer 503 with that reason.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What every handler reads.
pub(crate) struct AppState {
    pub manager: Arc<ModelManager>,
    pub metrics: Arc<HttpMetrics>,
    /// Fires when the drain bound passes: in-flight responses end with an error.
    pub shutdown: CancellationToken,
    /// Fires when the graceful shutdown begins: `/ready` answers 503 from then on.
    pub draining: CancellationToken,
    /// Largest accepted request body in bytes.
    pub body_limit: usize,
    /// Dependencies' health, when the embedder supplies a check.
    pub health_check: Option<HealthCheck>,
    /// Connection and request limits.
    pub limits: HttpLimits,
    /// The key clients must send as `Authorization: Bearer KEY`, when set.
    pub api_key: Option<String>,
    /// Where `/v1/responses` keeps responses.
    pub responses: SharedResponseStore,
    /// The background responses this frontend generates.
    pub background: BackgroundCancels,
    /// The resumable streams this frontend owns.
    pub streams: StreamRegistry,
    /// Each model's admission limits and counts.
    pub admission: Arc<Admission>,
}
