#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod backends;
mod codex_home;
mod end_to_end;
mod peer;
mod protocol;
mod resume;
mod scripted_model;
