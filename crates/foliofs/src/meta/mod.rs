//! Metadata: the in-memory state machine (`state`) and the store that makes
//! its changes durable through the journal (`store`).

mod state;
mod store;

pub use state::{ApplyError, Inode, InodeBody, MetaState, Xattrs};
pub use store::{LoadReport, MetaStore, Txn};
