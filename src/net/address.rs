//! Listener and connection addresses: the model's [`Address`], which the
//! network layer listens on and connects to.

pub use crate::model::Address;
