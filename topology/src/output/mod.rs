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
    /// An emit anchored to an input that was already acked or failed: the tuple would leave its
    /// ack tree (and be lost silently on a failure downstream).
    #[error(
        "emit anchored to input {handle} after it was acked or failed: emit before acking it, or use `emit_unanchored` for output that need not be replayed"
    )]
    AnchorCompleted {
        /// The held input's handle id.
        handle: u64,
    },
}
