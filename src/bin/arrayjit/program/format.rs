//! The program file model: what `arrayjit run` and `arrayjit emit-c` read (see
//! `docs/program-format.md`).
//!
//! Every struct rejects unknown fields, and every object of the format must be a JSON object:
//! serde's derived `Deserialize` for structs would also accept an array of the fields in
//! order (`["x", [2]]` for a tensor), so the derived impls are only used through
//! [`from_object`], which asks for a map. Names (precisions, memory modes, merge modes) must
//! be strings. The shapes that JSON cannot express as one serde derive (an `init` that is a
//! string or an object, a statement or run step whose kind is given by which keys it has,
//! numbers that may be written as `"inf"`) have hand-written `Deserialize` impls, so that
//! every error still carries serde_json's line and column.
//!
//! The numbers of `init.values` are kept as written ([`ValueLit`]) and converted to the
//! tensor's precision by [`super::decimal`], correctly rounded from the decimal text.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

/// A type whose fields are read from a JSON object by a derived visitor.
trait FromObject<'de>: Sized {
    /// What the object is, for "expected ..." messages.
    const WHAT: &'static str;
    /// Reads the fields (the derived `deserialize`, fed the object's entries).
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;
}

/// Deserializes `T` from a JSON object only: an array (or anything else) is an
/// "invalid type" error with serde_json's position.
fn from_object<'de, D: Deserializer<'de>, T: FromObject<'de>>(d: D) -> Result<T, D::Error> {
    struct V<T>(PhantomData<T>);
    impl<'de, T: FromObject<'de>> Visitor<'de> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(T::WHAT)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::from_map(map)
        }
    }
    d.deserialize_map(V(PhantomData))
}

/// Implements `Deserialize` for a struct whose derive is `#[serde(remote = "Self")]` (an
/// inherent `deserialize`), so that it only accepts a JSON object.
macro_rules! object_only {
    ($t:ty, $what:expr) => {
        impl<'de> FromObject<'de> for $t {
            const WHAT: &'static str = $what;
            fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
                // The inherent (derived) function, not the trait method being defined below.
                <$t>::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                from_object(d)
            }
        }
    };
}

/// Implements `Deserialize` for a unit-variant enum whose derive is
/// `#[serde(remote = "Self")]`, so that it only accepts a string (serde would also take
/// `{"single": null}`).
macro_rules! name_only {
    ($t:ty, $what:expr) => {
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$t, E> {
                        <$t>::deserialize(de::IntoDeserializer::<E>::into_deserializer(v))
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

/// A whole program file.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct Program {
    /// Number of virtual devices for a multi-device run; absent: one device, no device
    /// backend.
    #[serde(default)]
    pub devices: Option<usize>,
    /// The device backend for a multi-device run: `"multicore"` (default), `"sync"` or
    /// `"mpi"` (run under `mpirun`; `devices` counts the devices of all ranks).
    #[serde(default)]
    pub backend: Option<String>,
    /// The tensors, in declaration order.
    #[serde(default)]
    pub tensors: Vec<TensorDecl>,
    /// The static indices, shared by every routine.
    #[serde(default)]
    pub static_indices: Vec<StaticDecl>,
    /// The routines, compiled together as one batch.
    #[serde(default)]
    pub routines: Vec<RoutineDecl>,
    /// What to run, in order.
    #[serde(default)]
    pub run: Vec<Step>,
    /// The tensors to print, in order.
    #[serde(default)]
    pub print: Vec<String>,
}

object_only!(Program, "a program (one JSON object)");

/// A tensor declaration.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct TensorDecl {
    /// The unique name (also the node's label).
    pub name: String,
    /// The dims: non-empty, each at least 1.
    pub dims: Vec<usize>,
    /// The precision (default single).
    #[serde(default)]
    pub prec: PrecDecl,
    /// How the host array is filled; a tensor with an `init` is hosted.
    #[serde(default)]
    pub init: Option<InitDecl>,
    /// An explicit memory mode.
    #[serde(default)]
    pub memory: Option<MemoryDecl>,
}

object_only!(TensorDecl, "a tensor declaration (an object)");

/// A precision as written in a program file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(remote = "Self", rename_all = "snake_case")]
pub enum PrecDecl {
    /// `"byte"`
    Byte,
    /// `"uint16"`
    Uint16,
    /// `"int32"`
    Int32,
    /// `"uint32"`
    Uint32,
    /// `"int64"`
    Int64,
    /// `"uint64"`
    Uint64,
    /// `"fp8"` (E5M2)
    Fp8,
    /// `"half"`
    Half,
    /// `"bfloat16"`
    Bfloat16,
    /// `"single"` (the default)
    #[default]
    Single,
    /// `"double"`
    Double,
}

name_only!(
    PrecDecl,
    "a precision name: \"byte\", \"uint16\", \"int32\", \"uint32\", \"int64\", \"uint64\", \"fp8\", \"half\", \"bfloat16\", \"single\" or \"double\""
);

impl PrecDecl {
    /// The library's precision.
    pub fn prec(self) -> arrayjit::ir::Prec {
        use arrayjit::ir::Prec;
        match self {
            PrecDecl::Byte => Prec::Byte,
            PrecDecl::Uint16 => Prec::Uint16,
            PrecDecl::Int32 => Prec::Int32,
            PrecDecl::Uint32 => Prec::Uint32,
            PrecDecl::Int64 => Prec::Int64,
            PrecDecl::Uint64 => Prec::Uint64,
            PrecDecl::Fp8 => Prec::Fp8,
            PrecDecl::Half => Prec::Half,
            PrecDecl::Bfloat16 => Prec::Bfloat16,
            PrecDecl::Single => Prec::Single,
            PrecDecl::Double => Prec::Double,
        }
    }
}

/// An explicit memory mode as written in a program file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(remote = "Self", rename_all = "snake_case")]
pub enum MemoryDecl {
    /// `"virtual"`: inlined where used, never materialized.
    Virtual,
    /// `"local"`: materialized only during one routine call.
    Local,
    /// `"on_device"`: kept in the context across calls.
    OnDevice,
    /// `"hosted"`: kept in the context and on the host.
    Hosted,
}

name_only!(
    MemoryDecl,
    "a memory mode: \"virtual\", \"local\", \"on_device\" or \"hosted\""
);

impl MemoryDecl {
    /// The name as written in program files.
    pub fn name(self) -> &'static str {
        match self {
            MemoryDecl::Virtual => "virtual",
            MemoryDecl::Local => "local",
            MemoryDecl::OnDevice => "on_device",
            MemoryDecl::Hosted => "hosted",
        }
    }
}

/// How a tensor's host array is filled.
#[derive(Clone, Debug, PartialEq)]
pub enum InitDecl {
    /// `"zeros"`
    Zeros,
    /// `"range"`: each cell holds its row-major offset.
    Range,
    /// `{"values": [...], "strict": bool}`
    Values {
        /// The values, row-major, as written.
        values: Vec<ValueLit>,
        /// Whether there must be exactly one value per cell (default true); otherwise the
        /// values repeat cyclically.
        strict: bool,
    },
    /// `{"uniform": {"seed": N}}`
    Uniform {
        /// The generator's seed.
        seed: u64,
    },
    /// `{"file": "path"}`: raw bytes in the tensor's precision; a relative path is resolved
    /// against the program file's directory.
    File(String),
}

/// A value of `init.values` as written in the file. Numbers keep their decimal text, so that
/// they can be converted directly to the tensor's precision once it is known (see
/// [`super::decimal::convert`]); going through `f64` first would round twice.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueLit {
    /// A JSON number's text, e.g. `-1.5e3`.
    Number(Box<str>),
    /// `"inf"`
    Inf,
    /// `"-inf"`
    NegInf,
    /// `"nan"`
    NaN,
}

impl<'de> Deserialize<'de> for ValueLit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTED: &str = "a number or one of the strings \"inf\", \"-inf\", \"nan\"";
        let raw = <Box<RawValue>>::deserialize(d)?;
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'-' | b'0'..=b'9') => Ok(ValueLit::Number(text.into())),
            Some(b'"') => {
                let s: String = serde_json::from_str(text).map_err(de::Error::custom)?;
                match s.as_str() {
                    "inf" => Ok(ValueLit::Inf),
                    "-inf" => Ok(ValueLit::NegInf),
                    "nan" => Ok(ValueLit::NaN),
                    _ => Err(de::Error::invalid_value(de::Unexpected::Str(&s), &EXPECTED)),
                }
            }
            _ => {
                let unexpected = match text.as_bytes().first() {
                    Some(b'[') => de::Unexpected::Seq,
                    Some(b'{') => de::Unexpected::Map,
                    Some(b't') => de::Unexpected::Bool(true),
                    Some(b'f') => de::Unexpected::Bool(false),
                    _ => de::Unexpected::Unit,
                };
                Err(de::Error::invalid_type(unexpected, &EXPECTED))
            }
        }
    }
}

/// A static index declaration.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct StaticDecl {
    /// The name used in `{name}` einsum entries, fetches and run bindings.
    pub name: String,
    /// Valid values are `0..range`.
    #[serde(default)]
    pub range: Option<usize>,
}

object_only!(StaticDecl, "a static index declaration (an object)");

/// A routine: a name and its statements.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct RoutineDecl {
    /// The unique routine name.
    pub name: String,
    /// The statements, in order.
    pub code: Vec<Statement>,
}

object_only!(RoutineDecl, "a routine (an object)");

/// One statement of a routine or block.
#[derive(Clone, Debug, PartialEq)]
pub enum Statement {
    /// `{"assign": ..., "op": ..., "args": [...], ...}`
    Assign(AssignDecl),
    /// `{"fetch": ..., ...}`
    Fetch(FetchDecl),
    /// `{"comment": ..., "code": [...]}`
    Block(BlockDecl),
    /// `{"gather": Y, "from": E, "index": I}` or `{"scatter_add": G, "from": H, "index": I}`
    Gather(GatherDecl),
}

/// A gather or scatter-add statement (SPEC section 9.4).
#[derive(Clone, Debug, PartialEq)]
pub struct GatherDecl {
    /// The tensor written.
    pub lhs: String,
    /// The tensor read (the table for a gather, the rows for a scatter-add).
    pub from: String,
    /// The integer index tensor.
    pub index: String,
    /// A scatter-add rather than a gather.
    pub scatter: bool,
}

/// An assignment statement.
#[derive(Clone, Debug, PartialEq)]
pub struct AssignDecl {
    /// The tensor written.
    pub lhs: String,
    /// The operation's name (unary with one argument, binary with two).
    pub op: String,
    /// The arguments.
    pub args: Vec<ArgDecl>,
    /// The einsum-style spec; pointwise when absent.
    pub logic: Option<String>,
    /// `"set"` or a binary operation's name; `None` means `"set"`.
    pub accum: Option<String>,
    /// Whether to fill with the accumulator's neutral element first.
    pub init_neutral: bool,
}

/// An argument of an assignment.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgDecl {
    /// A tensor name.
    Tensor(String),
    /// `{"merge": NAME}`: this device's merge buffer, holding NAME.
    Merge(String),
}

/// A fetch statement.
#[derive(Clone, Debug, PartialEq)]
pub struct FetchDecl {
    /// The tensor filled.
    pub lhs: String,
    /// What it is filled with.
    pub kind: FetchKind,
}

/// What a fetch fills its tensor with.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchKind {
    /// `"constant": c` (its decimal text, converted exactly once the tensor's precision is
    /// known, as `values` are)
    Constant(ValueLit),
    /// `"slice": SRC, "index": STATIC`
    Slice {
        /// The tensor sliced (dims `[n] ++ lhs dims`).
        src: String,
        /// The static index selecting the slice.
        index: String,
    },
    /// `"embed_index": STATIC`
    EmbedIndex(String),
    /// `"random": {"seed": S}`: uniform values of SPEC section 9.5.
    Random {
        /// The generator's seed (a JSON integer in `0 .. 2^64`).
        seed: u64,
    },
}

/// The object of a random fetch, `{"seed": S}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomDecl {
    /// The generator's seed.
    pub seed: u64,
}

/// A block statement: a comment labelling a list of statements.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockDecl {
    /// The comment.
    pub comment: String,
    /// The statements.
    pub code: Vec<Statement>,
}

/// A run step.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// `{"routine": NAME, "bindings": {STATIC: value}, "device": D}`
    Routine {
        /// The routine run.
        routine: String,
        /// Values given to static indices before running.
        bindings: BTreeMap<String, i64>,
        /// The device (multi-device programs; default 0).
        device: Option<usize>,
    },
    /// `{"repeat": N, "steps": [...]}`
    Repeat {
        /// How many times (must not be negative).
        count: i64,
        /// The steps repeated.
        steps: Vec<Step>,
    },
    /// `{"copy": TENSOR, "from": S, "to": D, "merge": "no" | "streaming" | "copy"}`
    Copy {
        /// The tensor copied.
        tensor: String,
        /// The source device.
        from: usize,
        /// The destination device.
        to: usize,
        /// How the destination's merge buffer is used (default `"no"`).
        merge: MergeDecl,
    },
    /// `{"from_host": TENSOR, "device": D}`
    FromHost {
        /// The tensor copied.
        tensor: String,
        /// The device (default 0).
        device: Option<usize>,
    },
    /// `{"to_host": TENSOR, "device": D}`
    ToHost {
        /// The tensor copied.
        tensor: String,
        /// The device (default 0).
        device: Option<usize>,
    },
    /// `{"await": D}` or `{"await": "all"}`
    Await {
        /// The device, or `None` for all devices.
        device: Option<usize>,
    },
    /// `{"all_reduce": TENSOR, "devices": [D, ...] | "all"}`: afterwards every listed device
    /// holds the sum of the listed devices' values of the tensor.
    AllReduce {
        /// The tensor summed.
        tensor: String,
        /// The devices taking part, or `None` for all (the default).
        devices: Option<Vec<usize>>,
    },
}

/// How a `copy` step uses the destination device's merge buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(remote = "Self", rename_all = "snake_case")]
pub enum MergeDecl {
    /// Copy into the destination's own buffer of the tensor.
    #[default]
    No,
    /// The destination's merge buffer points at the source's buffer.
    Streaming,
    /// Copy into the destination's merge buffer.
    Copy,
}

name_only!(MergeDecl, "a merge mode: \"no\", \"streaming\" or \"copy\"");

/// The bindings of a run step: a map from static index names to values in which a name may
/// appear only once (serde's `BTreeMap` would silently keep the last of repeated keys).
struct UniqueBindings(BTreeMap<String, i64>);

impl<'de> Deserialize<'de> for UniqueBindings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UniqueBindings;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bindings: an object {STATIC_INDEX: value, ...}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueBindings, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    if out.contains_key(&key) {
                        return Err(de::Error::custom(format!(
                            "static index {} is bound twice in these bindings",
                            serde_json::to_string(&key).unwrap_or_else(|_| format!("{key:?}"))
                        )));
                    }
                    let v: i64 = map.next_value()?;
                    out.insert(key, v);
                }
                Ok(UniqueBindings(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The value of an `all_reduce` step's `"devices"`: a list of devices or `"all"`.
#[derive(Clone, Debug, PartialEq)]
struct DeviceList(Option<Vec<usize>>);

impl<'de> Deserialize<'de> for DeviceList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DeviceList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of device numbers or \"all\"")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<DeviceList, A::Error> {
                let mut out = vec![];
                while let Some(d) = seq.next_element::<usize>()? {
                    out.push(d);
                }
                Ok(DeviceList(Some(out)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DeviceList, E> {
                if v == "all" {
                    Ok(DeviceList(None))
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(v), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// The value of `"await"`: a device or `"all"`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct AwaitTarget(Option<usize>);

impl<'de> Deserialize<'de> for AwaitTarget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = AwaitTarget;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a device number or \"all\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<AwaitTarget, E> {
                Ok(AwaitTarget(Some(v as usize)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<AwaitTarget, E> {
                if v < 0 {
                    return Err(E::invalid_value(de::Unexpected::Signed(v), &self));
                }
                Ok(AwaitTarget(Some(v as usize)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AwaitTarget, E> {
                if v == "all" {
                    Ok(AwaitTarget(None))
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(v), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// Stores a field's value, rejecting a second occurrence of the key.
fn put<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
    slot: &mut Option<T>,
    key: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(key));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

const INIT_FIELDS: &[&str] = &["values", "strict", "uniform", "file"];

#[derive(Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
struct UniformDecl {
    seed: u64,
}

object_only!(UniformDecl, "{\"seed\": N}");

impl<'de> Deserialize<'de> for InitDecl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = InitDecl;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "an init: \"zeros\", \"range\", {\"values\": [...], \"strict\": bool}, \
                     {\"uniform\": {\"seed\": N}} or {\"file\": \"path\"}",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<InitDecl, E> {
                match v {
                    "zeros" => Ok(InitDecl::Zeros),
                    "range" => Ok(InitDecl::Range),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<InitDecl, A::Error> {
                let mut values: Option<Vec<ValueLit>> = None;
                let mut strict: Option<bool> = None;
                let mut uniform: Option<UniformDecl> = None;
                let mut file: Option<String> = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "values" => put(&mut map, &mut values, "values")?,
                        "strict" => put(&mut map, &mut strict, "strict")?,
                        "uniform" => put(&mut map, &mut uniform, "uniform")?,
                        "file" => put(&mut map, &mut file, "file")?,
                        other => return Err(de::Error::unknown_field(other, INIT_FIELDS)),
                    }
                }
                let kinds = values.is_some() as u8 + uniform.is_some() as u8 + file.is_some() as u8;
                if kinds != 1 {
                    return Err(de::Error::custom(
                        "an init object needs exactly one of the keys \"values\", \"uniform\" \
                         or \"file\"",
                    ));
                }
                if strict.is_some() && values.is_none() {
                    return Err(de::Error::custom("\"strict\" only goes with \"values\""));
                }
                Ok(if let Some(values) = values {
                    InitDecl::Values {
                        values,
                        strict: strict.unwrap_or(true),
                    }
                } else if let Some(u) = uniform {
                    InitDecl::Uniform { seed: u.seed }
                } else {
                    InitDecl::File(file.unwrap_or_default())
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for ArgDecl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ArgDecl;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tensor name or {\"merge\": NAME}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ArgDecl, E> {
                Ok(ArgDecl::Tensor(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ArgDecl, A::Error> {
                let mut merge: Option<String> = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "merge" => put(&mut map, &mut merge, "merge")?,
                        other => return Err(de::Error::unknown_field(other, &["merge"])),
                    }
                }
                merge
                    .map(ArgDecl::Merge)
                    .ok_or_else(|| de::Error::missing_field("merge"))
            }
        }
        d.deserialize_any(V)
    }
}

const STATEMENT_FIELDS: &[&str] = &[
    "assign",
    "op",
    "args",
    "logic",
    "accum",
    "init_neutral",
    "fetch",
    "constant",
    "slice",
    "index",
    "embed_index",
    "random",
    "gather",
    "scatter_add",
    "from",
    "comment",
    "code",
];
const ASSIGN_FIELDS: &[&str] = &["assign", "op", "args", "logic", "accum", "init_neutral"];
const FETCH_FIELDS: &[&str] = &[
    "fetch",
    "constant",
    "slice",
    "index",
    "embed_index",
    "random",
];
const BLOCK_FIELDS: &[&str] = &["comment", "code"];
const GATHER_FIELDS: &[&str] = &["gather", "from", "index"];
const SCATTER_FIELDS: &[&str] = &["scatter_add", "from", "index"];

fn quoted_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

impl<'de> Deserialize<'de> for Statement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Statement;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a statement: an object with \"assign\", \"fetch\" or \"comment\"")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Statement, A::Error> {
                let mut assign: Option<String> = None;
                let mut op: Option<String> = None;
                let mut args: Option<Vec<ArgDecl>> = None;
                let mut logic: Option<String> = None;
                let mut accum: Option<String> = None;
                let mut init_neutral: Option<bool> = None;
                let mut fetch: Option<String> = None;
                let mut constant: Option<ValueLit> = None;
                let mut slice: Option<String> = None;
                let mut index: Option<String> = None;
                let mut embed_index: Option<String> = None;
                let mut random: Option<RandomDecl> = None;
                let mut gather: Option<String> = None;
                let mut scatter_add: Option<String> = None;
                let mut from: Option<String> = None;
                let mut comment: Option<String> = None;
                let mut code: Option<Vec<Statement>> = None;
                let mut seen: Vec<&'static str> = vec![];
                while let Some(key) = map.next_key::<String>()? {
                    let k: &'static str = match key.as_str() {
                        "assign" => "assign",
                        "op" => "op",
                        "args" => "args",
                        "logic" => "logic",
                        "accum" => "accum",
                        "init_neutral" => "init_neutral",
                        "fetch" => "fetch",
                        "constant" => "constant",
                        "slice" => "slice",
                        "index" => "index",
                        "embed_index" => "embed_index",
                        "random" => "random",
                        "gather" => "gather",
                        "scatter_add" => "scatter_add",
                        "from" => "from",
                        "comment" => "comment",
                        "code" => "code",
                        other => return Err(de::Error::unknown_field(other, STATEMENT_FIELDS)),
                    };
                    match k {
                        "assign" => put(&mut map, &mut assign, k)?,
                        "op" => put(&mut map, &mut op, k)?,
                        "args" => put(&mut map, &mut args, k)?,
                        "logic" => put(&mut map, &mut logic, k)?,
                        "accum" => put(&mut map, &mut accum, k)?,
                        "init_neutral" => put(&mut map, &mut init_neutral, k)?,
                        "fetch" => put(&mut map, &mut fetch, k)?,
                        "constant" => put(&mut map, &mut constant, k)?,
                        "slice" => put(&mut map, &mut slice, k)?,
                        "index" => put(&mut map, &mut index, k)?,
                        "embed_index" => put(&mut map, &mut embed_index, k)?,
                        "random" => put(&mut map, &mut random, k)?,
                        "gather" => put(&mut map, &mut gather, k)?,
                        "scatter_add" => put(&mut map, &mut scatter_add, k)?,
                        "from" => put(&mut map, &mut from, k)?,
                        "comment" => put(&mut map, &mut comment, k)?,
                        _ => put(&mut map, &mut code, k)?,
                    }
                    seen.push(k);
                }
                let kinds: Vec<&str> = [
                    ("assign", assign.is_some()),
                    ("fetch", fetch.is_some()),
                    ("comment", comment.is_some()),
                    ("gather", gather.is_some()),
                    ("scatter_add", scatter_add.is_some()),
                ]
                .iter()
                .filter(|(_, present)| *present)
                .map(|(k, _)| *k)
                .collect();
                let (kind_name, allowed) = match kinds.as_slice() {
                    ["assign"] => ("an assignment", ASSIGN_FIELDS),
                    ["fetch"] => ("a fetch", FETCH_FIELDS),
                    ["comment"] => ("a block", BLOCK_FIELDS),
                    ["gather"] => ("a gather", GATHER_FIELDS),
                    ["scatter_add"] => ("a scatter_add", SCATTER_FIELDS),
                    [] => {
                        return Err(de::Error::custom(
                            "a statement needs one of the keys \"assign\" (assignment), \
                             \"fetch\" (fetch), \"gather\", \"scatter_add\" or \"comment\" \
                             (block)",
                        ))
                    }
                    many => {
                        return Err(de::Error::custom(format!(
                            "a statement has only one of the keys \"assign\", \"fetch\", \
                             \"gather\", \"scatter_add\" and \"comment\", this one has {}",
                            quoted_list(many)
                        )))
                    }
                };
                if let Some(k) = seen.iter().find(|k| !allowed.contains(k)) {
                    return Err(de::Error::custom(format!(
                        "field \"{k}\" does not belong in {kind_name} (its fields: {})",
                        quoted_list(allowed)
                    )));
                }
                if let Some(lhs) = assign {
                    return Ok(Statement::Assign(AssignDecl {
                        lhs,
                        op: op.ok_or_else(|| de::Error::missing_field("op"))?,
                        args: args.ok_or_else(|| de::Error::missing_field("args"))?,
                        logic,
                        accum,
                        init_neutral: init_neutral.unwrap_or(false),
                    }));
                }
                if let Some((lhs, scatter)) = gather
                    .map(|g| (g, false))
                    .or(scatter_add.map(|g| (g, true)))
                {
                    return Ok(Statement::Gather(GatherDecl {
                        lhs,
                        from: from.ok_or_else(|| de::Error::missing_field("from"))?,
                        index: index.ok_or_else(|| de::Error::missing_field("index"))?,
                        scatter,
                    }));
                }
                if let Some(lhs) = fetch {
                    let n = constant.is_some() as u8
                        + slice.is_some() as u8
                        + embed_index.is_some() as u8
                        + random.is_some() as u8;
                    if n != 1 {
                        return Err(de::Error::custom(
                            "a fetch needs exactly one of the keys \"constant\", \"slice\" \
                             (with \"index\"), \"embed_index\" or \"random\"",
                        ));
                    }
                    if index.is_some() && slice.is_none() {
                        return Err(de::Error::custom(
                            "\"index\" only goes with \"slice\" in a fetch",
                        ));
                    }
                    let kind = if let Some(c) = constant {
                        FetchKind::Constant(c)
                    } else if let Some(r) = random {
                        FetchKind::Random { seed: r.seed }
                    } else if let Some(src) = slice {
                        FetchKind::Slice {
                            src,
                            index: index.ok_or_else(|| de::Error::missing_field("index"))?,
                        }
                    } else {
                        FetchKind::EmbedIndex(embed_index.unwrap_or_default())
                    };
                    return Ok(Statement::Fetch(FetchDecl { lhs, kind }));
                }
                Ok(Statement::Block(BlockDecl {
                    comment: comment.unwrap_or_default(),
                    code: code.ok_or_else(|| de::Error::missing_field("code"))?,
                }))
            }
        }
        d.deserialize_map(V)
    }
}

const STEP_FIELDS: &[&str] = &[
    "routine",
    "bindings",
    "device",
    "repeat",
    "steps",
    "copy",
    "from",
    "to",
    "merge",
    "from_host",
    "to_host",
    "await",
    "all_reduce",
    "devices",
];

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Step;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a run step: {\"routine\": NAME, \"bindings\": {...}}, \
                     {\"repeat\": N, \"steps\": [...]}, {\"copy\": T, \"from\": S, \"to\": D}, \
                     {\"from_host\": T}, {\"to_host\": T}, {\"await\": D} or \
                     {\"all_reduce\": T, \"devices\": [D, ...]}",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Step, A::Error> {
                let mut routine: Option<String> = None;
                let mut bindings: Option<UniqueBindings> = None;
                let mut device: Option<usize> = None;
                let mut repeat: Option<i64> = None;
                let mut steps: Option<Vec<Step>> = None;
                let mut copy: Option<String> = None;
                let mut from: Option<usize> = None;
                let mut to: Option<usize> = None;
                let mut merge: Option<MergeDecl> = None;
                let mut from_host: Option<String> = None;
                let mut to_host: Option<String> = None;
                let mut await_: Option<AwaitTarget> = None;
                let mut all_reduce: Option<String> = None;
                let mut devices: Option<DeviceList> = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "routine" => put(&mut map, &mut routine, "routine")?,
                        "bindings" => put(&mut map, &mut bindings, "bindings")?,
                        "device" => put(&mut map, &mut device, "device")?,
                        "repeat" => put(&mut map, &mut repeat, "repeat")?,
                        "steps" => put(&mut map, &mut steps, "steps")?,
                        "copy" => put(&mut map, &mut copy, "copy")?,
                        "from" => put(&mut map, &mut from, "from")?,
                        "to" => put(&mut map, &mut to, "to")?,
                        "merge" => put(&mut map, &mut merge, "merge")?,
                        "from_host" => put(&mut map, &mut from_host, "from_host")?,
                        "to_host" => put(&mut map, &mut to_host, "to_host")?,
                        "await" => put(&mut map, &mut await_, "await")?,
                        "all_reduce" => put(&mut map, &mut all_reduce, "all_reduce")?,
                        "devices" => put(&mut map, &mut devices, "devices")?,
                        other => return Err(de::Error::unknown_field(other, STEP_FIELDS)),
                    }
                }
                let kinds = [
                    routine.is_some(),
                    repeat.is_some(),
                    copy.is_some(),
                    from_host.is_some(),
                    to_host.is_some(),
                    await_.is_some(),
                    all_reduce.is_some(),
                ];
                if kinds.iter().filter(|k| **k).count() > 1 {
                    return Err(de::Error::custom(
                        "a run step has exactly one of \"routine\", \"repeat\", \"copy\", \
                         \"from_host\", \"to_host\", \"await\", \"all_reduce\"",
                    ));
                }
                // Keys that belong to another kind of step.
                let stray = |ok: &[&str]| -> Result<(), A::Error> {
                    let present = [
                        ("bindings", bindings.is_some()),
                        ("device", device.is_some()),
                        ("steps", steps.is_some()),
                        ("from", from.is_some()),
                        ("to", to.is_some()),
                        ("merge", merge.is_some()),
                        ("devices", devices.is_some()),
                    ];
                    for (k, p) in present {
                        if p && !ok.contains(&k) {
                            return Err(de::Error::custom(format!(
                                "\"{k}\" does not go with this kind of run step"
                            )));
                        }
                    }
                    Ok(())
                };
                if let Some(routine) = routine {
                    stray(&["bindings", "device"])?;
                    return Ok(Step::Routine {
                        routine,
                        bindings: bindings.map(|b| b.0).unwrap_or_default(),
                        device,
                    });
                }
                if let Some(count) = repeat {
                    stray(&["steps"])?;
                    return Ok(Step::Repeat {
                        count,
                        steps: steps.ok_or_else(|| de::Error::missing_field("steps"))?,
                    });
                }
                if let Some(tensor) = copy {
                    stray(&["from", "to", "merge"])?;
                    return Ok(Step::Copy {
                        tensor,
                        from: from.ok_or_else(|| de::Error::missing_field("from"))?,
                        to: to.ok_or_else(|| de::Error::missing_field("to"))?,
                        merge: merge.unwrap_or_default(),
                    });
                }
                if let Some(tensor) = from_host {
                    stray(&["device"])?;
                    return Ok(Step::FromHost { tensor, device });
                }
                if let Some(tensor) = to_host {
                    stray(&["device"])?;
                    return Ok(Step::ToHost { tensor, device });
                }
                if let Some(AwaitTarget(device)) = await_ {
                    stray(&[])?;
                    return Ok(Step::Await { device });
                }
                if let Some(tensor) = all_reduce {
                    stray(&["devices"])?;
                    return Ok(Step::AllReduce {
                        tensor,
                        devices: devices.and_then(|d| d.0),
                    });
                }
                Err(de::Error::custom(
                    "a run step needs \"routine\" (with optional \"bindings\" and \"device\"), \
                     \"repeat\" (with \"steps\"), \"copy\" (with \"from\", \"to\", \"merge\"), \
                     \"from_host\", \"to_host\", \"await\" or \"all_reduce\" (with optional \
                     \"devices\")",
                ))
            }
        }
        d.deserialize_map(V)
    }
}
