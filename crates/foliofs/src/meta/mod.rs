//! Metadata: the inodes in shards, each under its own lock (`shards`), how
//! records change them (`state`), free space (`space`), checkpoints that
//! do not stop writers (`checkpoint`), the store that makes changes durable
//! through the journal (`store`), the checkpoint kept in a paged index on
//! volumes of format 3 (`indexed`), and the handles' lock-free copies
//! (`view`).

mod checkpoint;
mod free_set;
mod indexed;
mod inode;
mod load;
mod on_demand;
mod resident;
mod shards;
mod space;
mod state;
mod store;
mod view;

pub use inode::{Inode, InodeBody};
pub use load::LoadLimits;
pub use shards::{shard_of, InodeTable, MetaView};
pub use state::check_limits;
#[cfg(test)]
pub use store::test_hooks;
pub use store::{LoadReport, MetaStore, Txn};
pub use view::{InodeView, Viewed};
