//! Metadata: the in-memory state machine (`state`) and the store that makes
//! its changes durable through the journal (`store`).

mod state;
mod store;
mod view;

pub use state::{Inode, InodeBody, MetaState};
pub use store::{LoadReport, MetaStore, Txn};
pub use view::{InodeView, Viewed};
