//! Codex's exec-server protocol over capexec's capabilities.

pub mod sandbox_denied;
pub mod sandbox_intent;
pub mod websocket;
