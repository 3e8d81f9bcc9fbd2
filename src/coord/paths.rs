//! The znode layout of one topology reading one stream.
//!
//! ```text
//! {root}/topologies/{topology}/
//!   state                              lifecycle JSON (versioned get/set)
//!   drain                              drain notification JSON {deployment_id, requested_at_ms}
//!   tasks/task-NNNNNNNNNN              EPHEMERAL_SEQUENTIAL, one per live spout task
//!   workers/{workerId}                 EPHEMERAL, one per live worker process: its status JSON
//!   firers/{component}/task-NNNNNNNNNN EPHEMERAL_SEQUENTIAL, one per window firer; they share the timer partitions by sequence
//!   streams/{stream}/
//!     shards                           the shard list JSON (leader only; versioned writes; < 900 KB)
//!     committed                        the committed watermark, as the leader last computed it from
//!                                      `watermarks/`: PublishedWatermark JSON; what window firers read
//!     first_start                      while the topology's first start on the stream persists its
//!                                      starting positions: FirstStart JSON {latest_ms}; removed once
//!                                      the shard list is written (a leader that finds it resumes it)
//!     assignment                       which task reads which shard (leader only, fenced); watched
//!     finished/{shardId}               created with a shard's finished checkpoint; the leader watches
//!     checkpoints/{shardId}            checkpoint JSON, one per shard; hot, watched by nobody
//!     owners/{shardId}/lease-{task}-NNNNNNNNNN  EPHEMERAL_SEQUENTIAL; the lowest sequence owns the shard;
//!                                      the sequence is the lease token; `owners/{shardId}` is never
//!                                      deleted (not even when the shard is collected), so it never restarts
//!     watermarks/{task}                EPHEMERAL, one per spout task publishing its committed
//!                                      watermark (`task-NNNNNNNNNN`, its task node name):
//!                                      WatermarkReport JSON {generation, watermark_ms, updated_at_ms};
//!                                      the directory is created with the first report; read, never
//!                                      watched
//! ```

use super::error::CoordError;

/// Prefix of task registration znodes.
pub const TASK_PREFIX: &str = "task-";
/// Prefix of lease znodes.
pub const LEASE_PREFIX: &str = "lease-";

/// Every path the store uses, computed once from root, topology and stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyPaths {
    root: String,
    topology_name: String,
    stream_name: String,
    topology: String,
    state: String,
    tasks: String,
    workers: String,
    stream: String,
    shards: String,
    checkpoints: String,
    owners: String,
    assignment: String,
    finished: String,
    watermarks: String,
}

impl TopologyPaths {
    /// Builds the layout; rejects names that would escape their directory.
    pub fn new(root: &str, topology: &str, stream: &str) -> Result<Self, CoordError> {
        Self::build(root, topology, stream, None)
    }

    /// The layout of an intermediate stream between two stages of a topology: like
    /// [`TopologyPaths::new`], but its spout tasks register under `streams/{stream}/tasks`, so
    /// the readers of each stage's input are assigned that stream's shards only.
    pub fn for_stage_input(root: &str, topology: &str, stream: &str) -> Result<Self, CoordError> {
        Self::build(root, topology, stream, Some("tasks"))
    }

    /// The layout of a further source stream of a topology reading several (`--stream a
    /// --stream b`; the first keeps [`TopologyPaths::new`]): its spout tasks register under
    /// `streams/{stream}/source-tasks`, so its shards are assigned over its own readers, and the
    /// stream is not taken for a stage's intermediate stream (whose tasks register under
    /// `streams/{stream}/tasks`).
    pub fn for_source_stream(root: &str, topology: &str, stream: &str) -> Result<Self, CoordError> {
        Self::build(root, topology, stream, Some("source-tasks"))
    }

    fn build(root: &str, topology: &str, stream: &str, stream_tasks: Option<&str>) -> Result<Self, CoordError> {
        validate_root(root)?;
        validate_name("topology name", topology)?;
        validate_name("stream name", stream)?;
        let topo = format!("{root}/topologies/{topology}");
        let stream_path = format!("{topo}/streams/{stream}");
        Ok(Self {
            root: root.to_string(),
            topology_name: topology.to_string(),
            stream_name: stream.to_string(),
            state: format!("{topo}/state"),
            tasks: match stream_tasks {
                Some(dir) => format!("{stream_path}/{dir}"),
                None => format!("{topo}/tasks"),
            },
            workers: format!("{topo}/workers"),
            shards: format!("{stream_path}/shards"),
            checkpoints: format!("{stream_path}/checkpoints"),
            owners: format!("{stream_path}/owners"),
            assignment: format!("{stream_path}/assignment"),
            finished: format!("{stream_path}/finished"),
            watermarks: format!("{stream_path}/watermarks"),
            stream: stream_path,
            topology: topo,
        })
    }

    /// The configured root, e.g. `/squall`.
    pub fn root(&self) -> &str {
        &self.root
    }
    /// The topology name.
    pub fn topology_name(&self) -> &str {
        &self.topology_name
    }
    /// The stream name.
    pub fn stream_name(&self) -> &str {
        &self.stream_name
    }
    /// `{root}/topologies/{topology}`.
    pub fn topology(&self) -> &str {
        &self.topology
    }
    /// `.../{topology}/state`.
    pub fn state(&self) -> &str {
        &self.state
    }
    /// `.../{topology}/tasks`.
    pub fn tasks(&self) -> &str {
        &self.tasks
    }
    /// `.../{topology}/streams/{stream}`.
    pub fn stream(&self) -> &str {
        &self.stream
    }
    /// `.../streams/{stream}/shards`.
    pub fn shards(&self) -> &str {
        &self.shards
    }
    /// `.../streams/{stream}/checkpoints`.
    pub fn checkpoints(&self) -> &str {
        &self.checkpoints
    }
    /// `.../streams/{stream}/owners`.
    pub fn owners(&self) -> &str {
        &self.owners
    }
    /// `.../streams/{stream}/assignment`: the leader's assignment of shards to tasks.
    pub fn assignment(&self) -> &str {
        &self.assignment
    }
    /// `.../streams/{stream}/finished`: one child per finished shard.
    pub fn finished_dir(&self) -> &str {
        &self.finished
    }
    /// `.../finished/{shard_id}`.
    pub fn finished(&self, shard_id: &str) -> String {
        format!("{}/{shard_id}", self.finished)
    }
    /// `.../streams/{stream}/watermarks`: the spout tasks' committed watermark reports.
    pub fn watermarks_dir(&self) -> &str {
        &self.watermarks
    }
    /// `.../watermarks/{task}`: the committed watermark report of the task node `task`.
    pub fn watermark(&self, task: &str) -> String {
        format!("{}/{task}", self.watermarks)
    }
    /// `.../tasks/task-` (the sequential-create prefix).
    pub fn task_prefix(&self) -> String {
        format!("{}/{TASK_PREFIX}", self.tasks)
    }
    /// `.../{topology}/firers/{component}`: the window firers of a keyed-state component.
    pub fn firers(&self, component: &str) -> String {
        format!("{}/firers/{component}", self.topology)
    }
    /// `.../tasks/{node}`.
    pub fn task(&self, node: &str) -> String {
        format!("{}/{node}", self.tasks)
    }
    /// `.../checkpoints/{shard_id}`.
    pub fn checkpoint(&self, shard_id: &str) -> String {
        format!("{}/{shard_id}", self.checkpoints)
    }
    /// `.../owners/{shard_id}`.
    pub fn owner_dir(&self, shard_id: &str) -> String {
        format!("{}/{shard_id}", self.owners)
    }
    /// `.../owners/{shard_id}/lease-` (every lease of the shard starts with it).
    pub fn lease_prefix(&self, shard_id: &str) -> String {
        format!("{}/{shard_id}/{LEASE_PREFIX}", self.owners)
    }
    /// `.../owners/{shard_id}/lease-{holder}-` (the sequential-create prefix of `holder`'s lease):
    /// the holder's name is part of the node name, so owners are known from one listing.
    pub fn lease_prefix_for(&self, shard_id: &str, holder: &str) -> String {
        format!("{}/{shard_id}/{LEASE_PREFIX}{holder}-", self.owners)
    }

    /// The persistent directories [`super::ZkStore::connect`] creates.
    pub fn persistent_dirs(&self) -> [&str; 5] {
        [&self.tasks, &self.workers, &self.checkpoints, &self.owners, &self.finished]
    }

    /// `streams/{stream}/committed`: the committed watermark the leader publishes
    /// ([`super::PublishedWatermark`]).
    pub fn committed(&self) -> String {
        format!("{}/committed", self.stream)
    }

    /// `streams/{stream}/first_start`: the first start in progress ([`super::FirstStart`]).
    pub fn first_start(&self) -> String {
        format!("{}/first_start", self.stream)
    }

    /// `{topology}/drain`: the drain notification.
    pub fn drain(&self) -> String {
        format!("{}/drain", self.topology)
    }

    /// `{topology}/workers`: one ephemeral status znode per live worker.
    pub fn workers(&self) -> &str {
        &self.workers
    }

    /// `{topology}/stages/{stream}/producers`: one ephemeral znode per live task writing into the
    /// intermediate stream `stream`.
    pub fn producers(&self, stream: &str) -> String {
        format!("{}/stages/{stream}/producers", self.topology)
    }

    /// `{topology}/workers/{worker_id}`.
    pub fn worker(&self, worker_id: &str) -> String {
        format!("{}/{worker_id}", self.workers)
    }
}

/// Checks an absolute root path such as `/squall` or `/a/b`.
pub(crate) fn validate_root(root: &str) -> Result<(), CoordError> {
    let bad = |reason: &'static str| CoordError::InvalidName { what: "root znode", name: root.to_string(), reason };
    if !root.starts_with('/') || root.len() < 2 {
        return Err(bad("must be an absolute path below /, e.g. /squall"));
    }
    if root.ends_with('/') {
        return Err(bad("must not end with /"));
    }
    for part in root[1..].split('/') {
        validate_segment(part).map_err(bad)?;
    }
    Ok(())
}

/// Checks a single path segment: topology, stream or shard name.
pub(crate) fn validate_name(what: &'static str, name: &str) -> Result<(), CoordError> {
    validate_segment(name).map_err(|reason| CoordError::InvalidName { what, name: name.to_string(), reason })
}

fn validate_segment(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("must not be empty");
    }
    if s == "." || s == ".." || s == "zookeeper" {
        return Err("is reserved by ZooKeeper");
    }
    if s.contains('/') {
        return Err("must not contain /");
    }
    if s.chars().any(|c| c.is_control()) {
        return Err("must not contain control characters");
    }
    Ok(())
}

/// The holder named in a lease node `lease-{holder}-NNNNNNNNNN` (`None` for a bare `lease-NNNN`).
pub(crate) fn lease_holder(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(LEASE_PREFIX)?;
    let (holder, digits) = rest.rsplit_once('-')?;
    (!holder.is_empty() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(holder)
}

/// The numeric sequence suffix of a sequential znode name (`task-0000000012` -> 12).
pub(crate) fn sequence_of(name: &str) -> Option<u64> {
    let digits = name.rsplit_once('-').map(|(_, d)| d)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let p = TopologyPaths::new("/squall", "wc", "events").unwrap();
        assert_eq!(p.topology(), "/squall/topologies/wc");
        assert_eq!(p.state(), "/squall/topologies/wc/state");
        assert_eq!(p.task_prefix(), "/squall/topologies/wc/tasks/task-");
        assert_eq!(p.shards(), "/squall/topologies/wc/streams/events/shards");
        assert_eq!(p.checkpoint("shardId-000"), "/squall/topologies/wc/streams/events/checkpoints/shardId-000");
        assert_eq!(p.lease_prefix("s1"), "/squall/topologies/wc/streams/events/owners/s1/lease-");
        assert_eq!(
            p.lease_prefix_for("s1", "task-0000000003"),
            "/squall/topologies/wc/streams/events/owners/s1/lease-task-0000000003-"
        );
        assert_eq!(p.assignment(), "/squall/topologies/wc/streams/events/assignment");
        assert_eq!(p.finished("s1"), "/squall/topologies/wc/streams/events/finished/s1");
        assert_eq!(p.watermarks_dir(), "/squall/topologies/wc/streams/events/watermarks");
        assert_eq!(p.watermark("task-0000000012"), "/squall/topologies/wc/streams/events/watermarks/task-0000000012");
        let p = TopologyPaths::for_stage_input("/squall", "wc", "wc-words").unwrap();
        assert_eq!(p.task_prefix(), "/squall/topologies/wc/streams/wc-words/tasks/task-");
        assert_eq!(p.producers("wc-words"), "/squall/topologies/wc/stages/wc-words/producers");
    }

    #[test]
    fn lease_holders() {
        assert_eq!(lease_holder("lease-task-0000000003-0000000012"), Some("task-0000000003"));
        assert_eq!(sequence_of("lease-task-0000000003-0000000012"), Some(12));
        assert_eq!(lease_holder("lease-0000000012"), None);
        assert_eq!(lease_holder("lease-x-12a"), None);
        assert_eq!(lease_holder("other"), None);
    }

    #[test]
    fn rejects_escaping_names() {
        assert!(TopologyPaths::new("/squall", "a/b", "s").is_err());
        assert!(TopologyPaths::new("/squall", "..", "s").is_err());
        assert!(TopologyPaths::new("/squall", "t", "").is_err());
        assert!(TopologyPaths::new("squall", "t", "s").is_err());
        assert!(TopologyPaths::new("/squall//x", "t", "s").is_err());
    }

    #[test]
    fn sequences() {
        assert_eq!(sequence_of("task-0000000012"), Some(12));
        assert_eq!(sequence_of("lease-0000000000000000042"), Some(42));
        assert_eq!(sequence_of("task-"), None);
        assert_eq!(sequence_of("task-12a"), None);
        assert_eq!(sequence_of("nodash"), None);
    }
}
