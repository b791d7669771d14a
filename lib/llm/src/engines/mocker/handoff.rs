//! The mocker in disaggregated serving ([`KvHandoff`]): a prefill is a one-token
//! generation whose full prompt blocks stay cached; receiving KV waits the simulated
//! transfer time (blocks · `block_size` · `kv_bytes_per_token` / `kv_transfer_gbps`,
//! divided by `speedup_ratio`), then stores the blocks as cached, as if computed here.

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::oneshot;

use crate::kv_router::protocols::hash_full_blocks;
use super::engine::MockerEngine;
use super::scheduler::Command;
use crate::disagg::{KvHandoff, KvPrefill, KvTransferDescriptor};
use crate::engine::{EngineError, RequestContext, TokenEngine};
use crate::protocols::common::PreprocessedRequest;

fn shut_down() -> EngineError {
    EngineError::Unavailable("mocker engine shut down".to_string())
}

impl MockerEngine {
    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.send_command(command(reply)).map_err(|_| shut_down())?;
        answer.await.map_err(|_| shut_down())
    }
}

#[async_trait]
impl KvPrefill for MockerEngine {
    async fn prefill_for_transfer(
        &self,
        mut request: PreprocessedRequest,
        ctx: RequestContext,
        source_worker: u64,
    ) -> Result<KvTransferDescriptor, EngineError> {
        request.stop_conditions.max_tokens = Some(1);
        let tokens = request.token_ids.clone();
        let mut stream = self.generate(request, ctx.clone()).await?;
        while let Some(item) = stream.next().await {
            item?;
        }
        if ctx.is_stopped() {
            return Err(EngineError::Unavailable("the prefill was cancelled".to_string()));
        }
        let block_size = self.args().block_size;
        Ok(KvTransferDescriptor {
            request_id: ctx.id().to_string(),
            source_worker,
            block_size,
            block_hashes: hash_full_blocks(&tokens, block_size).into_iter().map(|h| h.block_hash).collect(),
            prompt_tokens: tokens.len(),
            engine_params: None,
        })
    }

}

#[async_trait]
impl KvHandoff for MockerEngine {
    async fn cached_prefix_tokens(&self, tokens: &[u32]) -> Result<usize, EngineError> {
        let block_size = self.args().block_size;
        let hashes = hash_full_blocks(tokens, block_size).into_iter().map(|h| h.block_hash).collect();
        let blocks = self.ask(|reply| Command::CachedPrefix { hashes, reply }).await?;
        Ok(blocks * block_size)
    }

    async fn receive_kv(&self, tokens: &[u32], descriptor: &KvTransferDescriptor) -> Result<usize, EngineError> {
        let block_size = self.args().block_size;
        if descriptor.block_size != block_size {
            return Err(EngineError::Internal(format!(
                "KV blocks of {} tokens cannot be received by an engine with blocks of {block_size}",
                descriptor.block_size
            )));
        }
        let hashes = hash_full_blocks(tokens, block_size);
        let matching = hashes.iter().zip(&descriptor.block_hashes).take_while(|(h, d)| h.block_hash == **d).count();
        if matching < descriptor.block_hashes.len() {
            return Err(EngineError::Internal(format!(
                "the KV descriptor of request {} does not describe this prompt (block {matching} differs)",
                descriptor.request_id
            )));
        }
        tokio::time::sleep(self.args().transfer_duration(matching)).await;
        let hashes = hashes[..matching].to_vec();
        let blocks = self.ask(|reply| Command::Import { hashes, reply }).await?;
        Ok(blocks)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engines::mocker::MockerArgs;
    use crate::protocols::common::StopConditions;

    fn engine() -> MockerEngine {
        MockerEngine::new(MockerArgs { speedup_ratio: 1000.0, ..Default::default() }, None).unwrap()
    }

    #[tokio::test]
    async fn a_prefill_handed_over_is_cached_on_the_receiver() {
        let (prefill, decode) = (engine(), engine());
        let tokens: Vec<u32> = (0..100).collect();
        let request = PreprocessedRequest { token_ids: tokens.clone(), ..Default::default() };
        let descriptor = tokio::time::timeout(
            Duration::from_secs(10),
            prefill.prefill_for_transfer(request, RequestContext::new("r1"), 7),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!((descriptor.block_hashes.len(), descriptor.prompt_tokens, descriptor.source_worker), (6, 100, 7));
        assert_eq!(prefill.cached_prefix_tokens(&tokens).await.unwrap(), 96);
        assert_eq!(decode.cached_prefix_tokens(&tokens).await.unwrap(), 0);
        assert_eq!(decode.receive_kv(&tokens, &descriptor).await.unwrap(), 6);
        assert_eq!(decode.cached_prefix_tokens(&tokens).await.unwrap(), 96);
        // The decode then computes only the rest of the prompt.
        let request = PreprocessedRequest {
            token_ids: tokens.clone(),
            stop_conditions: StopConditions { max_tokens: Some(2), ..Default::default() },
            ..Default::default()
        };
        let out: Vec<_> = decode.generate(request, RequestContext::new("r1")).await.unwrap().collect().await;
        assert_eq!(out.len(), 2);
        assert!(decode.metrics().gpu_prefix_cache_hit_rate > 0.9);
    }

    #[tokio::test]
    async fn a_descriptor_of_another_prompt_is_refused() {
        let (prefill, decode) = (engine(), engine());
        let request = PreprocessedRequest { token_ids: (0..64).collect(), ..Default::default() };
        let descriptor = prefill.prefill_for_transfer(request, RequestContext::new("r"), 1).await.unwrap();
        let other: Vec<u32> = (1..65).collect();
        let err = decode.receive_kv(&other, &descriptor).await.unwrap_err();
        assert!(err.to_string().contains("does not describe"), "{err}");
        let mut wrong_size = descriptor.clone();
        wrong_size.block_size = 32;
        assert!(decode.receive_kv(&other, &wrong_size).await.is_err());
    }
}
