//! Exactly-once keyed state (MillWheel) in DynamoDB.
//!
//! A bolt written as a [`KeyedState`] computation (a key per input, and a function that applies
//! an input to its key's state, of any serde type) runs inside [`ExactlyOnce`], which keeps each
//! key's state in one DynamoDB item and applies every Kinesis record to it exactly once, across
//! failures, replays, restarts, rebalancing, resharding and zombie workers.
//!
//! # The protocol, per key
//! Inputs wait up to `commit_interval_ms` (or until `max_batch_inputs` wait), grouped by key.
//! Then, for every waiting key at once:
//! 1. Its item is read with a strongly consistent read (BatchGetItem, 100 keys per call).
//! 2. Each input is judged against the item's deduplication data ([`Dedup`]): an input read
//!    under an older lease than the last writer's of its shard is *refused* (a zombie's: it
//!    fails); one already applied is a *duplicate* (skipped; the productions it made are sent
//!    again); the rest are applied, in arrival order, by the user's `apply`.
//! 3. State, deduplication data and the pending productions are written in ONE conditional
//!    PutItem: `attribute_not_exists(pk)` for a new key, else `ver = :read_version`. If another
//!    writer changed the item since the read, the condition fails and the key is read and judged
//!    again, so a zombie that read before the new owner wrote is refused on its second look.
//! 4. Then the inputs are acked, and strong productions emitted anchored to them. An input whose
//!    productions cannot be sent fails instead (replayed, then dead-lettered): one whose
//!    productions do not encode fails before the commit, one whose emit is refused (fields that
//!    do not match the declared ones) or whose stored productions no longer decode fails after.
//!
//! Record ids are exact: (stream, shard, sequence, sub-sequence); every stream has a
//! `shardId-000000000000`, so a topology reading several streams (`--stream a --stream b`) keeps
//! their records apart. Per source shard the item keeps the spout's checkpoint as carried by the
//! latest tuple (everything at or below is handled and never read again) and the ids applied above
//! it, pruned as the checkpoint moves: bounded by the records in flight, and right when a failed
//! record is replayed after later ones. The fencing token is the sequential number of the reader's
//! lease znode in ZooKeeper, which only grows per shard. Once a shard's descendant (after a split
//! or a merge) has been read, the shard is finished: its entry is dropped, and a late record of it
//! (a zombie's) is refused, so an item stays bounded however often the stream is resharded (see
//! [`Dedup`]).
//!
//! Strong productions are stored with the id of the input that made them and re-sent whenever
//! that input is seen again (its tuple tree may not have completed), until the checkpoint passes
//! it (its tree completed). With `weak_productions` they are emitted at apply time and not stored.
//!
//! Acking must be on (`acking: true`, the default): the bolt and the [`WindowFirer`] refuse to
//! start without it, since the spout would then checkpoint every record before its commit.
//!
//! # Across stages
//! With [`StateConfig::production_ids`] each strong production carries an id
//! ([`PRODUCTION_FIELDS`]: the input's stream-qualified shard, `{sequence}:{sub_sequence}:{index}`,
//! the input's checkpoint and the shard's hash key range). Put through a stage boundary declared
//! with [`crate::stage::Boundary::exactly_once`] (whose input tuples then also carry the
//! intermediate record's ids and hash key), an `ExactlyOnce` bolt of the next stage applies each
//! production once, however many copies the intermediate stream holds (a producer's replay
//! re-sends stored productions, a put retried after a lost answer writes twice): it deduplicates
//! by production id per source shard, and fences by the intermediate shard's lease token. A stage
//! that sees a copy of a production it applied re-sends what it made under the ids it *first*
//! made it with, so chains of any number of exactly-once stages stay exact. The floor that prunes
//! production ids takes effect only once this stage's own checkpoint has passed the production
//! that carried it, and only for productions whose hash key lies in the hash key range of the
//! intermediate shard it was read from (see [`Dedup`]): a production that fails here and is
//! replayed later is still applied, and so is one of a lagging shard when this stage's key is
//! coarser than the boundary's (a per-region or a global total).
//!
//! # Timers and firing
//! [`KeyedState::timer`] gives a key a fire time (a window's end); the commit writes it with the
//! item (`tpart`, `fire_at`), which puts the item in the sparse index [`TIMER_INDEX`]. A
//! [`WindowFirer`] spout fires each key once the committed watermark (every record that arrived
//! before it committed; published to ZooKeeper by the Kinesis spout with
//! `committed_watermark_interval_ms`; over several streams, the minimum of theirs) reaches its
//! time, and the item, read strongly, still holds that timer (the index is eventually consistent
//! on DynamoDB and may list a timer already taken out): it freezes the item (`fired`, conditional
//! on the version), emits the state through [`OnFire`] with [`FIRE_FIELDS`] as a tracked tuple, and
//! takes the timer out of the index once that tuple's tree completed. Inputs of a fired key are
//! late: acked, counted (`state_late`), not applied. A firing that fails, or whose firer dies, is
//! emitted again with the same frozen state: consumers deduplicate by `fire_key`. [`Tumbling`]
//! windows of a [`WindowAggregate`] are both halves at once (the bolt's keyed state with a timer
//! at each window's end, and the firer's output).
//!
//! The store unreachable, throttling or failing with 5xx means back-pressure: the bolt retries
//! with a back-off and takes no new input meanwhile; a commit is never skipped. State over
//! DynamoDB's 400 KB item limit fails the inputs that would take the item past it (each alone: the
//! others of its commit round are committed), with an error naming the key and the size; stored
//! state that no longer deserializes (state, deduplication data or version) is never overwritten:
//! its key's inputs fail with an error naming the key and the table (and dead-letter after their
//! retries).
//!
//! # Table schema
//! [`StateStore`] reaches the table through [`StateApi`], its eight operations: DynamoDB through
//! the AWS SDK, or, for a state endpoint `sim://NAME`, the model the simulator registered
//! ([`register_state_api`]).
//!
//! One table (`--state-table`, created on first start with on-demand billing), partition key
//! `pk` (S), no sort key, one sparse index (below). One item per key and component:
//!
//! | attribute | type | content |
//! | --- | --- | --- |
//! | `pk` | S | `{topology}/{component}/{key}` |
//! | `scope` | S | `{topology}/{component}` |
//! | `key` | S | the key |
//! | `ver` | N | version, 1 on the first write, +1 per commit (the write condition) |
//! | `state` | B | the user state, JSON |
//! | `dedup` | B | JSON of [`Dedup`]: per `{stream}/{shard}`, `floor`, `token`, `range`, `applied` (id -> productions); for productions of another stage, per its qualified source shard `floors` (per intermediate hash range), `candidates`, `applied` (id -> productions, the identity they were first emitted under, hash key), `range` |
//! | `updated_ms` | N | time of the last commit (ms since the epoch) |
//! | `tpart` | S | with a pending or unconfirmed timer: `{scope}#{n}`, n = FNV-1a of the key mod `timer_partitions` |
//! | `fire_at` | N | with `tpart`: the fire time (ms since the epoch) |
//! | `fired` | BOOL | true once fired: the state is frozen |
//!
//! Index [`TIMER_INDEX`] (`timers`): partition key `tpart`, sort key `fire_at`, keys only; sparse
//! (only items with a timer are in it). Created with the table; a table created before timers
//! existed gets it from the firer where DynamoDB can add it.
//!
//! DynamoDB transactions are not used (dynalite has none), and none are needed: a commit is one
//! conditional write of one item.

mod bolt;
pub mod dedup;
mod fire;
pub mod store;
mod window;

pub use bolt::{
    ExactlyOnce, KeyedState, PRODUCTION_FIELDS, StateConfig, scope, timer_partition, with_production_fields,
};
pub use dedup::{Dedup, ProductionId, RecordId, Verdict};
pub use fire::{FIRE_FIELDS, FirerConfig, OnFire, WindowFirer};
pub use store::{
    MAX_ITEM_BYTES, NewItem, ScopeItem, StateApi, StateEndpoint, StateError, StateStore, StoredItem, TIMER_INDEX,
    TimerAt, WriteOutcome, register_state_api,
};
pub use window::{Tumbling, Window, WindowAggregate};

/// Runs `call` on every item, at most `limit` at a time (the state store's
/// `write_concurrency`); the results in the order the calls finish.
async fn concurrently<T, R, F: std::future::Future<Output = R>>(
    items: impl IntoIterator<Item = T>,
    limit: usize,
    call: impl FnMut(T) -> F,
) -> Vec<R> {
    use futures::StreamExt;
    futures::stream::iter(items.into_iter().map(call)).buffer_unordered(limit.max(1)).collect().await
}
