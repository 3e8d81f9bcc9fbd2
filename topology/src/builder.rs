//! [`TopologyBuilder`]: declare spouts, bolts, their output streams and input groupings; `build()`
//! validates the graph into a [`Topology`].

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::component::{Bolt, Spout, TaskContext};
use crate::config::{ComponentConfig, ConfigError};
use crate::executor::{self, BoltWiring, SpoutWiring, TaskFailure};
use crate::grouping::{All, Direct, FieldsGrouping, Global, Grouping, LocalOrShuffle, Shuffle};
use crate::tuple::{DEFAULT_STREAM, Fields};

/// A topology that does not validate. Each message names the component, stream or field at fault
/// and how to fix it. Always the topology author's fault; never retryable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No spout was declared.
    #[error("topology `{topology}` has no spout: add one with `set_spout`")]
    NoSpouts {
        /// Topology name.
        topology: String,
    },
    /// Two components share an id.
    #[error("component id `{id}` is declared twice: component ids must be unique")]
    DuplicateComponent {
        /// The id.
        id: String,
    },
    /// A component has parallelism 0.
    #[error("component `{component}` has parallelism 0: give it at least 1 task")]
    ZeroParallelism {
        /// The component.
        component: String,
    },
    /// A stream is declared twice by one component.
    #[error("component `{component}` declares stream `{stream}` twice")]
    DuplicateStream {
        /// The component.
        component: String,
        /// The stream.
        stream: String,
    },
    /// A field name appears twice in one stream.
    #[error("stream `{stream}` of component `{component}` declares field `{field}` twice")]
    DuplicateField {
        /// The component.
        component: String,
        /// The stream.
        stream: String,
        /// The field.
        field: String,
    },
    /// A bolt subscribes to nothing.
    #[error("bolt `{bolt}` has no input: subscribe it with e.g. `.shuffle_grouping(\"<component>\")`")]
    NoInputs {
        /// The bolt.
        bolt: String,
    },
    /// A bolt subscribes to a component that does not exist.
    #[error("bolt `{bolt}` subscribes to unknown component `{component}`; known components: {known:?}")]
    UnknownComponent {
        /// The subscribing bolt.
        bolt: String,
        /// The missing component.
        component: String,
        /// Declared component ids.
        known: Vec<String>,
    },
    /// A bolt subscribes to a stream its source does not declare.
    #[error(
        "bolt `{bolt}` subscribes to stream `{stream}` of `{component}`, which declares only {declared:?}; declare it with `.output(\"{stream}\", &[..])` or use the `_from` grouping with a declared stream"
    )]
    UnknownStream {
        /// The subscribing bolt.
        bolt: String,
        /// The source component.
        component: String,
        /// The missing stream.
        stream: String,
        /// Streams the source declares.
        declared: Vec<String>,
    },
    /// A fields grouping names a field the stream does not declare.
    #[error(
        "bolt `{bolt}` groups stream `{stream}` of `{component}` by unknown field `{field}`; the stream declares {declared:?}"
    )]
    UnknownGroupingField {
        /// The subscribing bolt.
        bolt: String,
        /// The source component.
        component: String,
        /// The stream.
        stream: String,
        /// The missing field.
        field: String,
        /// Fields the stream declares.
        declared: Vec<String>,
    },
    /// A fields grouping with no field.
    #[error("bolt `{bolt}` groups stream `{stream}` of `{component}` by an empty field list: name at least one field")]
    EmptyGroupingFields {
        /// The subscribing bolt.
        bolt: String,
        /// The source component.
        component: String,
        /// The stream.
        stream: String,
    },
    /// A bolt subscribes to the same stream twice.
    #[error("bolt `{bolt}` subscribes to stream `{stream}` of `{component}` twice: keep one grouping")]
    DuplicateSubscription {
        /// The subscribing bolt.
        bolt: String,
        /// The source component.
        component: String,
        /// The stream.
        stream: String,
    },
    /// A direct grouping on a plain stream, or another grouping on a direct stream: the tuples
    /// would reach no task.
    #[error("bolt `{bolt}` subscribes to {kind} stream `{stream}` of `{component}` with {grouping} grouping: {fix}")]
    DirectMismatch {
        /// The subscribing bolt.
        bolt: String,
        /// The source component.
        component: String,
        /// The stream.
        stream: String,
        /// "direct" or "plain".
        kind: &'static str,
        /// The grouping's name.
        grouping: &'static str,
        /// How to fix it.
        fix: &'static str,
    },
    /// A stream declared from a type whose fields cannot be listed.
    #[error("component `{component}` declares stream `{stream}` from a type: {message}")]
    Typed {
        /// The component.
        component: String,
        /// The stream.
        stream: String,
        /// Why (names the type).
        message: String,
    },
    /// A component's configuration is invalid.
    #[error("component `{component}`: {source}")]
    Config {
        /// The component.
        component: String,
        /// What is wrong.
        source: ConfigError,
    },
    /// The subscriptions form a cycle.
    #[error("the topology has a cycle: {} -> {}; topologies must be acyclic", path.join(" -> "), path.first().map(String::as_str).unwrap_or(""))]
    Cycle {
        /// The components on the cycle, in subscription order.
        path: Vec<String>,
    },
}

/// Spawns the executor of one spout task (type-erased over the spout type).
pub(crate) trait SpoutFactory: Send + Sync {
    fn spawn(&self, ctx: TaskContext, wiring: SpoutWiring) -> BoxFuture<'static, Result<(), TaskFailure>>;
}

/// Spawns the executor of one bolt task.
pub(crate) trait BoltFactory: Send + Sync {
    fn spawn(&self, ctx: TaskContext, wiring: BoltWiring) -> BoxFuture<'static, Result<(), TaskFailure>>;
}

struct TypedSpout<S, F>(F, PhantomData<fn() -> S>);

impl<S: Spout, F: Fn(&TaskContext) -> S + Send + Sync + 'static> SpoutFactory for TypedSpout<S, F> {
    fn spawn(&self, ctx: TaskContext, wiring: SpoutWiring) -> BoxFuture<'static, Result<(), TaskFailure>> {
        let spout = (self.0)(&ctx);
        Box::pin(executor::spout::run(spout, ctx, wiring))
    }
}

struct TypedBolt<B, F>(F, PhantomData<fn() -> B>);

impl<B: Bolt, F: Fn(&TaskContext) -> B + Send + Sync + 'static> BoltFactory for TypedBolt<B, F> {
    fn spawn(&self, ctx: TaskContext, wiring: BoltWiring) -> BoxFuture<'static, Result<(), TaskFailure>> {
        let bolt = (self.0)(&ctx);
        Box::pin(executor::bolt::run(bolt, ctx, wiring))
    }
}

#[derive(Clone)]
pub(crate) enum Kind {
    Spout(Arc<dyn SpoutFactory>),
    Bolt(Arc<dyn BoltFactory>),
}

struct InputDecl {
    component: String,
    stream: String,
    grouping: Arc<dyn Grouping>,
}

struct ComponentDecl {
    id: String,
    parallelism: usize,
    kind: Kind,
    /// (name, fields, direct)
    streams: Vec<(String, Vec<String>, bool)>,
    inputs: Vec<InputDecl>,
    config: ComponentConfig,
    /// Declaration errors reported by `build`.
    errors: Vec<BuildError>,
}

/// One subscription, resolved to indices.
#[derive(Clone)]
pub(crate) struct InputSpec {
    pub(crate) component: usize,
    pub(crate) stream: usize,
    pub(crate) grouping: Arc<dyn Grouping>,
}

/// One component of a built topology.
#[derive(Clone)]
pub(crate) struct ComponentSpec {
    pub(crate) id: Arc<str>,
    pub(crate) parallelism: usize,
    pub(crate) kind: Kind,
    /// (name, fields, direct)
    pub(crate) streams: Vec<(Arc<str>, Fields, bool)>,
    pub(crate) inputs: Vec<InputSpec>,
    pub(crate) config: Arc<ComponentConfig>,
}

/// A validated topology, ready to run with [`crate::run_local`] or a [`crate::LocalCluster`].
#[derive(Clone)]
pub struct Topology {
    pub(crate) name: Arc<str>,
    pub(crate) components: Vec<ComponentSpec>,
}

impl Topology {
    /// The topology's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Component ids in declaration order.
    pub fn component_ids(&self) -> impl Iterator<Item = &str> {
        self.components.iter().map(|c| &*c.id)
    }

    /// The parallelism of a component.
    pub fn parallelism(&self, component: &str) -> Option<usize> {
        self.components.iter().find(|c| &*c.id == component).map(|c| c.parallelism)
    }
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Topology");
        d.field("name", &self.name);
        for c in &self.components {
            let kind = match c.kind {
                Kind::Spout(_) => "spout",
                Kind::Bolt(_) => "bolt",
            };
            d.field(&c.id, &format_args!("{kind} x{}", c.parallelism));
        }
        d.finish()
    }
}

/// Declares a topology's components and wiring.
///
/// ```
/// # use squall_topology::*;
/// # struct S; impl Spout for S { type MsgId = (); async fn next_tuple(&mut self, _: &mut SpoutOutput<()>) -> Result<(), ComponentError> { Ok(()) } }
/// # struct B; impl Bolt for B { async fn execute(&mut self, _: Tuple, _: &mut BoltOutput) -> Result<(), ComponentError> { Ok(()) } }
/// let mut b = TopologyBuilder::new("t");
/// b.set_spout("s", 1, |_| S).fields(&["word"]);
/// b.set_bolt("count", 2, |_| B).fields_grouping("s", &["wrod"]);
/// let err = b.build().unwrap_err();
/// assert!(err.to_string().contains("unknown field `wrod`"));
/// ```
pub struct TopologyBuilder {
    name: String,
    components: Vec<ComponentDecl>,
}

/// Declares a spout's output streams.
pub struct SpoutDeclarer<'a> {
    decl: &'a mut ComponentDecl,
}

/// Declares a bolt's output streams and input groupings.
pub struct BoltDeclarer<'a> {
    decl: &'a mut ComponentDecl,
}

fn declare_output<S: AsRef<str>>(decl: &mut ComponentDecl, stream: &str, fields: &[S], direct: bool) {
    decl.streams.push((stream.to_owned(), fields.iter().map(|f| f.as_ref().to_owned()).collect(), direct));
}

macro_rules! outputs {
    () => {
        /// Declares a named output stream with its fields.
        pub fn output<S: AsRef<str>>(&mut self, stream: &str, fields: &[S]) -> &mut Self {
            declare_output(self.decl, stream, fields, false);
            self
        }

        /// Declares the `"default"` stream's fields.
        pub fn fields<S: AsRef<str>>(&mut self, fields: &[S]) -> &mut Self {
            self.output(DEFAULT_STREAM, fields)
        }

        /// Declares a direct stream (Storm's `declareStream(id, true, fields)`): the component
        /// emits on it only with `emit_direct`, naming the task, and bolts subscribe to it only
        /// with `direct_grouping`. A mismatch is a build error (or an emit error), never a tuple
        /// that reaches no task.
        pub fn direct_output<S: AsRef<str>>(&mut self, stream: &str, fields: &[S]) -> &mut Self {
            declare_output(self.decl, stream, fields, true);
            self
        }

        /// Declares the `"default"` stream's fields from a record type's field names
        /// ([`crate::typed::fields_of`]); emit it with `emit(&record)`, read it with
        /// `tuple.decode::<T>()`. A type without named fields is a build error.
        pub fn fields_of<T: serde::Deserialize<'static>>(&mut self) -> &mut Self {
            self.output_of::<T>(DEFAULT_STREAM)
        }

        /// Declares a named stream's fields from a record type's field names.
        pub fn output_of<T: serde::Deserialize<'static>>(&mut self, stream: &str) -> &mut Self {
            match crate::typed::fields_of::<T>() {
                Ok(fields) => declare_output(self.decl, stream, &fields, false),
                Err(e) => self.decl.errors.push(BuildError::Typed {
                    component: self.decl.id.clone(),
                    stream: stream.to_owned(),
                    message: e.to_string(),
                }),
            }
            self
        }

        /// Sets this component's configuration (overrides, timers, its own settings).
        pub fn config(&mut self, config: ComponentConfig) -> &mut Self {
            self.decl.config = config;
            self
        }

        /// The component's id, as a handle for subscriptions ([`Source`]).
        pub fn id(&self) -> ComponentId {
            ComponentId(Arc::from(self.decl.id.as_str()))
        }

        /// A handle on one of this component's streams, for subscriptions ([`Source`]).
        pub fn stream(&self, stream: &str) -> StreamId {
            StreamId { component: Arc::from(self.decl.id.as_str()), stream: Arc::from(stream) }
        }
    };
}

impl SpoutDeclarer<'_> {
    outputs!();
}

/// A component's id, from its declarer's [`SpoutDeclarer::id`] / [`BoltDeclarer::id`]: a typed
/// handle for subscriptions instead of a string.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ComponentId(Arc<str>);

impl ComponentId {
    /// A handle on the component `id` (e.g. to hand to a factory before the component is
    /// declared).
    pub fn new(id: &str) -> Self {
        ComponentId(Arc::from(id))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A handle on one of the component's streams.
    pub fn stream(&self, stream: &str) -> StreamId {
        StreamId { component: self.0.clone(), stream: Arc::from(stream) }
    }
}

/// A component's stream, from [`SpoutDeclarer::stream`] / [`BoltDeclarer::stream`] or
/// [`ComponentId::stream`]: a typed handle for subscriptions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StreamId {
    component: Arc<str>,
    stream: Arc<str>,
}

impl StreamId {
    /// A handle on `stream` of `component` (e.g. to hand to the component's factory, which
    /// runs before the declarer could give it).
    pub fn new(component: &str, stream: &str) -> Self {
        StreamId { component: Arc::from(component), stream: Arc::from(stream) }
    }

    /// The emitting component's id.
    pub fn component(&self) -> &str {
        &self.component
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }
}

/// A stream an emit names: its name (`&str`, `String`) or a [`StreamId`] handle. A handle of
/// another component's stream is an emit error.
pub trait StreamRef {
    /// The stream's name.
    fn name(&self) -> &str;

    /// The component the stream belongs to, when known.
    fn component(&self) -> Option<&str> {
        None
    }
}

impl StreamRef for &str {
    fn name(&self) -> &str {
        self
    }
}

impl StreamRef for String {
    fn name(&self) -> &str {
        self
    }
}

impl StreamRef for &String {
    fn name(&self) -> &str {
        self
    }
}

impl StreamRef for &StreamId {
    fn name(&self) -> &str {
        &self.stream
    }

    fn component(&self) -> Option<&str> {
        Some(&self.component)
    }
}

/// What a grouping subscribes to: a component's default stream (a `&str` id or a
/// [`ComponentId`]) or a given stream ([`StreamId`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    component: String,
    stream: String,
}

impl From<&str> for Source {
    fn from(component: &str) -> Self {
        Source { component: component.to_owned(), stream: DEFAULT_STREAM.to_owned() }
    }
}

impl From<&ComponentId> for Source {
    fn from(c: &ComponentId) -> Self {
        Source { component: c.0.to_string(), stream: DEFAULT_STREAM.to_owned() }
    }
}

impl From<&StreamId> for Source {
    fn from(s: &StreamId) -> Self {
        Source { component: s.component.to_string(), stream: s.stream.to_string() }
    }
}

macro_rules! groupings {
    ($( $(#[$doc:meta])* $name:ident, $from:ident => $g:expr ;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&mut self, source: impl Into<Source>) -> &mut Self {
                let s = source.into();
                self.grouping(&s.component, &s.stream, $g)
            }
            $(#[$doc])*
            /// (Subscribes to a named stream.)
            pub fn $from(&mut self, component: &str, stream: &str) -> &mut Self {
                self.grouping(component, stream, $g)
            }
        )*
    };
}

impl BoltDeclarer<'_> {
    outputs!();

    /// Subscribes to `stream` of `component` with any grouping strategy.
    pub fn grouping(&mut self, component: &str, stream: &str, grouping: impl Grouping) -> &mut Self {
        self.decl.inputs.push(InputDecl {
            component: component.to_owned(),
            stream: stream.to_owned(),
            grouping: Arc::new(grouping),
        });
        self
    }

    groupings! {
        /// Spreads tuples evenly over this bolt's tasks.
        shuffle_grouping, shuffle_grouping_from => Shuffle;
        /// Sends every tuple to every task.
        all_grouping, all_grouping_from => All;
        /// Sends every tuple to task 0.
        global_grouping, global_grouping_from => Global;
        /// Receives only `emit_direct` tuples, at the task the emitter picks.
        direct_grouping, direct_grouping_from => Direct;
        /// Prefers tasks in the emitter's process, else shuffles (in-process: a shuffle).
        local_or_shuffle_grouping, local_or_shuffle_grouping_from => LocalOrShuffle;
    }

    /// Sends tuples with equal values of `fields` to the same task.
    pub fn fields_grouping(&mut self, source: impl Into<Source>, fields: &[&str]) -> &mut Self {
        let s = source.into();
        self.grouping(&s.component, &s.stream, FieldsGrouping::new(fields))
    }

    /// Fields grouping on a named stream.
    pub fn fields_grouping_from(&mut self, component: &str, stream: &str, fields: &[&str]) -> &mut Self {
        self.grouping(component, stream, FieldsGrouping::new(fields))
    }
}

impl TopologyBuilder {
    /// Starts a topology named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        TopologyBuilder { name: name.into(), components: Vec::new() }
    }

    /// Adds a spout with `parallelism` tasks; `factory` makes one instance per task.
    pub fn set_spout<S, F>(&mut self, id: &str, parallelism: usize, factory: F) -> SpoutDeclarer<'_>
    where
        S: Spout,
        F: Fn(&TaskContext) -> S + Send + Sync + 'static,
    {
        self.components.push(ComponentDecl {
            id: id.to_owned(),
            parallelism,
            kind: Kind::Spout(Arc::new(TypedSpout(factory, PhantomData))),
            streams: Vec::new(),
            inputs: Vec::new(),
            config: ComponentConfig::default(),
            errors: Vec::new(),
        });
        let decl = self.components.last_mut().expect("just pushed");
        SpoutDeclarer { decl }
    }

    /// Adds a bolt with `parallelism` tasks; `factory` makes one instance per task.
    pub fn set_bolt<B, F>(&mut self, id: &str, parallelism: usize, factory: F) -> BoltDeclarer<'_>
    where
        B: Bolt,
        F: Fn(&TaskContext) -> B + Send + Sync + 'static,
    {
        self.components.push(ComponentDecl {
            id: id.to_owned(),
            parallelism,
            kind: Kind::Bolt(Arc::new(TypedBolt(factory, PhantomData))),
            streams: Vec::new(),
            inputs: Vec::new(),
            config: ComponentConfig::default(),
            errors: Vec::new(),
        });
        let decl = self.components.last_mut().expect("just pushed");
        BoltDeclarer { decl }
    }

    /// Validates the declarations; the first problem found is returned.
    pub fn build(self) -> Result<Topology, BuildError> {
        let comps = &self.components;
        if !comps.iter().any(|c| matches!(c.kind, Kind::Spout(_))) {
            return Err(BuildError::NoSpouts { topology: self.name.clone() });
        }
        let mut index = HashMap::new();
        for (i, c) in comps.iter().enumerate() {
            if index.insert(c.id.as_str(), i).is_some() {
                return Err(BuildError::DuplicateComponent { id: c.id.clone() });
            }
            if c.parallelism == 0 {
                return Err(BuildError::ZeroParallelism { component: c.id.clone() });
            }
            if let Some(e) = c.errors.first() {
                return Err(e.clone());
            }
            c.config.validate().map_err(|source| BuildError::Config { component: c.id.clone(), source })?;
            let mut seen = HashSet::new();
            for (s, fields, _) in &c.streams {
                if !seen.insert(s.as_str()) {
                    return Err(BuildError::DuplicateStream { component: c.id.clone(), stream: s.clone() });
                }
                let mut fs = HashSet::new();
                for f in fields {
                    if !fs.insert(f.as_str()) {
                        return Err(BuildError::DuplicateField {
                            component: c.id.clone(),
                            stream: s.clone(),
                            field: f.clone(),
                        });
                    }
                }
            }
        }
        let mut specs: Vec<ComponentSpec> = comps
            .iter()
            .map(|c| {
                // the default stream first: the common emit finds it with one compare
                let mut streams: Vec<(Arc<str>, Fields, bool)> =
                    c.streams.iter().map(|(s, f, d)| (Arc::from(s.as_str()), Fields::new(f), *d)).collect();
                streams.sort_by_key(|(s, _, _)| &**s != DEFAULT_STREAM);
                ComponentSpec {
                    id: Arc::from(c.id.as_str()),
                    parallelism: c.parallelism,
                    kind: c.kind.clone(),
                    streams,
                    inputs: Vec::new(),
                    config: Arc::new(c.config.clone()),
                }
            })
            .collect();
        for (bi, c) in comps.iter().enumerate() {
            if matches!(c.kind, Kind::Spout(_)) {
                continue;
            }
            if c.inputs.is_empty() {
                return Err(BuildError::NoInputs { bolt: c.id.clone() });
            }
            let mut subs = HashSet::new();
            for input in &c.inputs {
                let Some(&src) = index.get(input.component.as_str()) else {
                    return Err(BuildError::UnknownComponent {
                        bolt: c.id.clone(),
                        component: input.component.clone(),
                        known: comps.iter().map(|c| c.id.clone()).collect(),
                    });
                };
                let Some(stream) = specs[src].streams.iter().position(|(s, _, _)| **s == *input.stream) else {
                    return Err(BuildError::UnknownStream {
                        bolt: c.id.clone(),
                        component: input.component.clone(),
                        stream: input.stream.clone(),
                        declared: comps[src].streams.iter().map(|(s, _, _)| s.clone()).collect(),
                    });
                };
                if !subs.insert((src, stream)) {
                    return Err(BuildError::DuplicateSubscription {
                        bolt: c.id.clone(),
                        component: input.component.clone(),
                        stream: input.stream.clone(),
                    });
                }
                let (_, fields, direct) = &specs[src].streams[stream];
                if input.grouping.is_direct() != *direct {
                    let (kind, fix) = if *direct {
                        ("direct", "subscribe to a direct stream with `direct_grouping`")
                    } else {
                        ("plain", "declare the stream with `.direct_output(..)` on the source, or use another grouping")
                    };
                    return Err(BuildError::DirectMismatch {
                        bolt: c.id.clone(),
                        component: input.component.clone(),
                        stream: input.stream.clone(),
                        kind,
                        grouping: input.grouping.name(),
                        fix,
                    });
                }
                if let Err(field) = input.grouping.check_fields(fields) {
                    return Err(if field.is_empty() {
                        BuildError::EmptyGroupingFields {
                            bolt: c.id.clone(),
                            component: input.component.clone(),
                            stream: input.stream.clone(),
                        }
                    } else {
                        BuildError::UnknownGroupingField {
                            bolt: c.id.clone(),
                            component: input.component.clone(),
                            stream: input.stream.clone(),
                            field,
                            declared: fields.to_vec(),
                        }
                    });
                }
                specs[bi].inputs.push(InputSpec { component: src, stream, grouping: input.grouping.clone() });
            }
        }
        if let Some(cycle) = find_cycle(&specs) {
            return Err(BuildError::Cycle { path: cycle.into_iter().map(|i| specs[i].id.to_string()).collect() });
        }
        Ok(Topology { name: Arc::from(self.name.as_str()), components: specs })
    }
}

/// Finds a cycle in the subscription graph (edges source -> subscriber), as a path of indices.
fn find_cycle(specs: &[ComponentSpec]) -> Option<Vec<usize>> {
    let n = specs.len();
    let mut downstream = vec![Vec::new(); n];
    for (i, c) in specs.iter().enumerate() {
        for input in &c.inputs {
            downstream[input.component].push(i);
        }
    }
    // 0 = unvisited, 1 = on stack, 2 = done
    let mut state = vec![0u8; n];
    let mut stack: Vec<usize> = Vec::new();
    fn dfs(v: usize, down: &[Vec<usize>], state: &mut [u8], stack: &mut Vec<usize>) -> Option<Vec<usize>> {
        state[v] = 1;
        stack.push(v);
        for &w in &down[v] {
            if state[w] == 1 {
                let start = stack.iter().position(|&x| x == w).unwrap_or(0);
                return Some(stack[start..].to_vec());
            }
            if state[w] == 0 {
                if let Some(c) = dfs(w, down, state, stack) {
                    return Some(c);
                }
            }
        }
        stack.pop();
        state[v] = 2;
        None
    }
    (0..n).find_map(|v| if state[v] == 0 { dfs(v, &downstream, &mut state, &mut stack) } else { None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::ComponentError;
    use crate::output::{BoltOutput, SpoutOutput};
    use crate::tuple::Tuple;

    struct S;
    impl Spout for S {
        type MsgId = ();
        async fn next_tuple(&mut self, _out: &mut SpoutOutput<()>) -> Result<(), ComponentError> {
            Ok(())
        }
    }
    struct B;
    impl Bolt for B {
        async fn execute(&mut self, _t: Tuple, _o: &mut BoltOutput) -> Result<(), ComponentError> {
            Ok(())
        }
    }

    fn base() -> TopologyBuilder {
        let mut b = TopologyBuilder::new("t");
        b.set_spout("s", 2, |_| S).fields(&["sentence"]).output("side", &["x", "y"]);
        b
    }

    #[test]
    fn valid_topology_builds() {
        let mut b = base();
        b.set_bolt("split", 2, |_| B).shuffle_grouping("s").fields(&["word"]);
        b.set_bolt("count", 3, |_| B).fields_grouping("split", &["word"]).all_grouping_from("s", "side");
        let t = b.build().unwrap();
        assert_eq!(t.name(), "t");
        assert_eq!(t.component_ids().collect::<Vec<_>>(), ["s", "split", "count"]);
        assert_eq!(t.parallelism("count"), Some(3));
    }

    fn err(f: impl FnOnce(&mut TopologyBuilder)) -> BuildError {
        let mut b = base();
        f(&mut b);
        b.build().unwrap_err()
    }

    #[test]
    fn names_each_problem() {
        let e = err(|b| {
            b.set_bolt("x", 1, |_| B).shuffle_grouping("nope");
        });
        assert!(matches!(&e, BuildError::UnknownComponent { component, .. } if component == "nope"), "{e}");
        let e = err(|b| {
            b.set_bolt("x", 1, |_| B).shuffle_grouping_from("s", "missing");
        });
        assert!(e.to_string().contains("stream `missing` of `s`"), "{e}");
        let e = err(|b| {
            b.set_bolt("x", 1, |_| B).fields_grouping_from("s", "side", &["z"]);
        });
        assert!(e.to_string().contains("unknown field `z`") && e.to_string().contains("[\"x\", \"y\"]"), "{e}");
        let e = err(|b| {
            b.set_bolt("x", 0, |_| B).shuffle_grouping("s");
        });
        assert_eq!(e, BuildError::ZeroParallelism { component: "x".into() });
        let e = err(|b| {
            b.set_bolt("s", 1, |_| B).shuffle_grouping("s");
        });
        assert_eq!(e, BuildError::DuplicateComponent { id: "s".into() });
        let e = err(|b| {
            b.set_bolt("x", 1, |_| B);
        });
        assert_eq!(e, BuildError::NoInputs { bolt: "x".into() });
        let e = err(|b| {
            b.set_bolt("x", 1, |_| B).shuffle_grouping("s").shuffle_grouping("s");
        });
        assert!(matches!(e, BuildError::DuplicateSubscription { .. }), "{e}");
        let e = err(|b| {
            b.set_bolt("x", 1, |_| B).fields_grouping("s", &[]);
        });
        assert!(matches!(e, BuildError::EmptyGroupingFields { .. }), "{e}");
        let e = err(|b| {
            b.set_bolt("x", 1, |_| B).shuffle_grouping("s").output("o", &["a", "a"]);
        });
        assert!(matches!(e, BuildError::DuplicateField { .. }), "{e}");
        let e = TopologyBuilder::new("empty").build().unwrap_err();
        assert!(matches!(e, BuildError::NoSpouts { .. }));
        // direct grouping on a plain stream: its tuples would reach no task
        let e = err(|b| {
            b.set_bolt("x", 1, |_| B).direct_grouping_from("s", "side");
        });
        assert!(matches!(&e, BuildError::DirectMismatch { kind: "plain", .. }), "{e}");
        assert!(e.to_string().contains("direct_output"), "{e}");
        // and another grouping on a direct stream
        let mut b = base();
        b.set_spout("d", 1, |_| S).direct_output("to", &["v"]);
        b.set_bolt("x", 1, |_| B).shuffle_grouping_from("d", "to");
        let e = b.build().unwrap_err();
        assert!(matches!(&e, BuildError::DirectMismatch { kind: "direct", grouping: "shuffle", .. }), "{e}");
        let mut b = base();
        b.set_spout("d", 1, |_| S).direct_output("to", &["v"]);
        b.set_bolt("x", 1, |_| B).direct_grouping_from("d", "to");
        assert!(b.build().is_ok());
        // component config is validated and named
        let e = err(|b| {
            b.set_bolt("x", 1, |_| B)
                .shuffle_grouping("s")
                .config(ComponentConfig { tick_interval_ms: Some(0), ..ComponentConfig::default() });
        });
        assert!(e.to_string().contains("component `x`") && e.to_string().contains("tick_interval_ms"), "{e}");
    }

    #[test]
    fn detects_cycles() {
        let e = err(|b| {
            b.set_bolt("a", 1, |_| B).shuffle_grouping("s").shuffle_grouping("c").fields(&["v"]);
            b.set_bolt("b", 1, |_| B).shuffle_grouping("a").fields(&["v"]);
            b.set_bolt("c", 1, |_| B).shuffle_grouping("b").fields(&["v"]);
        });
        match &e {
            BuildError::Cycle { path } => {
                assert_eq!(path.len(), 3);
                assert!(path.contains(&"a".to_owned()) && path.contains(&"c".to_owned()));
            }
            other => panic!("expected cycle, got {other}"),
        }
        assert!(e.to_string().contains("cycle"));
        let e = err(|b| {
            b.set_bolt("self", 1, |_| B).shuffle_grouping("s").shuffle_grouping("self").fields(&["v"]);
        });
        assert_eq!(e, BuildError::Cycle { path: vec!["self".into()] });
    }
}
