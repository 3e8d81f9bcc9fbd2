//! Emitting: [`SpoutOutput`] and [`BoltOutput`] are where components emit, hold and ack
//! inputs, schedule timers and flush. Routing and send buffers are internal (`route`).

mod bolt;
pub(crate) mod records;
pub(crate) mod route;
mod spout;

pub use bolt::{AckHandle, BoltOutput, Inputs, Timer};
pub use records::Record;
pub(crate) use spout::SpoutAcks;
pub use spout::SpoutOutput;

/// An emit the topology's declarations do not allow, or an anchor that is gone. The
/// component's fault; not retryable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EmitError {
    /// The stream is not declared by the emitting component.
    #[error(
        "component `{component}` emitted on undeclared stream `{stream}`; declared streams: {declared:?} (declare it with `.output(\"{stream}\", &[..])`)"
    )]
    UnknownStream {
        /// Emitting component.
        component: String,
        /// The stream used.
        stream: String,
        /// The declared streams.
        declared: Vec<String>,
    },
    /// The number of values differs from the number of declared fields.
    #[error(
        "component `{component}` emitted {got} values on stream `{stream}`, which declares {expected} fields {fields:?}"
    )]
    FieldCount {
        /// Emitting component.
        component: String,
        /// The stream used.
        stream: String,
        /// Declared field count.
        expected: usize,
        /// Values given.
        got: usize,
        /// Declared fields.
        fields: Vec<String>,
    },
    /// A plain emit on a stream declared direct: it would reach no task.
    #[error(
        "component `{component}` emitted on direct stream `{stream}` without a task: use `emit_direct(task, \"{stream}\", ..)`, or declare the stream with `.output` instead of `.direct_output`"
    )]
    DirectStream {
        /// Emitting component.
        component: String,
        /// The stream used.
        stream: String,
    },
    /// `emit_direct` on a stream not declared direct: no direct subscriber could receive it.
    #[error(
        "component `{component}` used emit_direct on stream `{stream}`, which is not declared direct: declare it with `.direct_output(\"{stream}\", &[..])` and subscribe with `direct_grouping`, or use `emit`"
    )]
    NotDirectStream {
        /// Emitting component.
        component: String,
        /// The stream used.
        stream: String,
    },
    /// `emit_direct` named a task the direct subscriber does not have.
    #[error(
        "direct emit on stream `{stream}` to task {task}, but subscriber `{consumer}` has only {parallelism} tasks"
    )]
    DirectTaskOutOfRange {
        /// The stream used.
        stream: String,
        /// The subscriber.
        consumer: String,
        /// The task index given.
        task: usize,
        /// The subscriber's parallelism.
        parallelism: usize,
    },
    /// A grouping's router chose a task the subscriber does not have (a custom [`Router`]
    /// must return indices below [`RouteContext::target_tasks`]). Nothing was sent.
    ///
    /// [`Router`]: crate::Router
    /// [`RouteContext::target_tasks`]: crate::RouteContext::target_tasks
    #[error(
        "the `{grouping}` grouping of subscriber `{consumer}` on stream `{stream}` chose task {task}, but `{consumer}` has {parallelism} tasks: a Router must return task indices below RouteContext::target_tasks"
    )]
    RouterTaskOutOfRange {
        /// The stream used.
        stream: String,
        /// The grouping's name ([`Grouping::name`](crate::Grouping::name)).
        grouping: &'static str,
        /// The subscriber.
        consumer: String,
        /// The task index the router chose.
        task: usize,
        /// The subscriber's parallelism.
        parallelism: usize,
    },
    /// A record's field names are not the stream's, in the stream's order (checked on the first
    /// record of each type emitted with `emit_record`): read by name downstream, or grouped by a
    /// field, its values would be taken for other fields.
    #[error(
        "a record of type `{type_name}` with fields {fields:?} was emitted on stream `{stream}`, which declares {declared:?}: declare the stream with `fields_of::<{type_name}>()`, or give the type the stream's fields in its order"
    )]
    RecordFields {
        /// The stream used.
        stream: String,
        /// The record's type.
        type_name: &'static str,
        /// The record's field names, in serialization order.
        fields: Vec<String>,
        /// The stream's declared fields.
        declared: Vec<String>,
    },
    /// A typed record could not be encoded into values (see [`crate::typed::to_values`]).
    #[error("component `{component}` emitted a record that does not encode into tuple values: {message}")]
    Encode {
        /// Emitting component.
        component: String,
        /// What the encoder said (names the type and field).
        message: String,
    },
    /// `defer_ack` outside `execute`.
    #[error("defer_ack called outside execute: there is no current input to hold")]
    NoCurrentInput,
    /// An emit anchored to an input that was already acked or failed (the current input held
    /// and acked, or only held inputs the engine failed): the tuple would leave its ack tree
    /// (and be lost silently on a failure downstream).
    #[error(
        "emit anchored to input {handle} after it was acked or failed: emit before acking it, or use `emit_unanchored` for output that need not be replayed"
    )]
    AnchorCompleted {
        /// The held input's handle id.
        handle: u64,
    },
}
