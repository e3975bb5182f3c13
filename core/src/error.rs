//! Errors shared by the whole fabric.
//!
//! - [`Refusal`]: a request refused, as a gRPC code and a message. It is the part every service
//!   crate's error enum has in common (bad input, nothing found, not allowed, a bound hit, a peer
//!   down): each crate's enum holds it as one variant (`Error::Refused`), so the code of a
//!   refusal is chosen once where it is made and the crate's `From<Error> for tonic::Status`
//!   only says what its own failures (configuration, storage, transport) are on the wire. The
//!   gate ([`crate::guard::Gate`]) answers with a [`Refusal`] too. [`Refuse`] gives every type
//!   that holds a refusal the constructors (`Error::not_found("…")`).
//! - [`Error`]: what gma-core's own functions (durations, instants, timestamps, actions, limits,
//!   the endpoint section, certificates, addresses) fail with. One enum for the library rather
//!   than one per module: these are all "this value is not usable", told by a message that names
//!   the value and what to write instead; the variant only says which kind of value.
//!
//! Messages are lowercase, carry no trailing period and say what to do.

use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

/// A request refused: the gRPC code and a message for the caller (lowercase, no trailing
/// period, says what to do). Converts to and from [`Status`] without loss of either. Serialized
/// as `{"CodeName": "message"}` (`{"NotFound": "no producer record with id a"}`): the form the
/// directory's replicated replies had when each code was a variant of its error enum, so
/// members of either version read each other's replies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    code: Code,
    message: String,
}

impl Refusal {
    pub fn new(code: Code, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }

    pub fn code(&self) -> Code {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

/// The one mapping of a refusal to the wire.
impl From<Refusal> for Status {
    fn from(r: Refusal) -> Status {
        Status::new(r.code, r.message)
    }
}

/// A status received (from a peer, or made by tonic) passed on as a refusal: its code and
/// message are kept, its metadata and details are not.
impl From<Status> for Refusal {
    fn from(s: Status) -> Refusal {
        Refusal::new(s.code(), s.message())
    }
}

impl Serialize for Refusal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(&format!("{:?}", self.code), &self.message)?;
        m.end()
    }
}

impl<'de> Deserialize<'de> for Refusal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Refusal, D::Error> {
        use serde::de::Error as _;
        let m = std::collections::BTreeMap::<String, String>::deserialize(d)?;
        let mut entries = m.into_iter();
        let (Some((name, message)), None) = (entries.next(), entries.next()) else {
            return Err(D::Error::custom(
                "a refusal is one entry: {\"CodeName\": \"message\"}",
            ));
        };
        (0..=16)
            .map(Code::from_i32)
            .find(|c| format!("{c:?}") == name)
            .map(|code| Refusal { code, message })
            .ok_or_else(|| D::Error::custom(format!("unknown gRPC code {name:?}")))
    }
}

macro_rules! constructors {
    ($($(#[$doc:meta])* $name:ident => $code:ident,)*) => {
        /// Constructors of refusals for any error type that holds one (`From<Refusal>`): a
        /// service crate's `Error`, [`Refusal`] itself. Named like tonic's `Status`
        /// constructors, with the same codes.
        pub trait Refuse: From<Refusal> + Sized {
            $(
                $(#[$doc])*
                fn $name(message: impl Into<String>) -> Self {
                    Refusal::new(Code::$code, message).into()
                }
            )*
        }
    };
}

constructors! {
    /// The request is malformed. INVALID_ARGUMENT.
    invalid_argument => InvalidArgument,
    /// Nothing matched the request. NOT_FOUND.
    not_found => NotFound,
    /// What the request creates exists already. ALREADY_EXISTS.
    already_exists => AlreadyExists,
    /// The caller may not do this. PERMISSION_DENIED.
    permission_denied => PermissionDenied,
    /// The caller must say who it is first. UNAUTHENTICATED.
    unauthenticated => Unauthenticated,
    /// A bound was hit (a rate, a queue, a count). RESOURCE_EXHAUSTED.
    resource_exhausted => ResourceExhausted,
    /// The request does not fit the state things are in. FAILED_PRECONDITION.
    failed_precondition => FailedPrecondition,
    /// The operation was cut short (a peer ended before it finished). ABORTED.
    aborted => Aborted,
    /// The request asked past the end of what is kept. OUT_OF_RANGE.
    out_of_range => OutOfRange,
    /// A peer could not be reached, or this side cannot answer now. UNAVAILABLE.
    unavailable => Unavailable,
    /// A peer answered something this side cannot use. INTERNAL.
    internal => Internal,
}

impl<E: From<Refusal>> Refuse for E {}

/// The one `From<Error> for tonic::Status` of a service crate whose error enum holds a
/// [`Refusal`] as `Error::Refused`: a refusal keeps its code and message, the arms given say
/// what the crate's own variants are on the wire, and every other variant is INTERNAL with the
/// error's message.
///
/// ```ignore
/// gma_core::status_from!(Error,
///     e @ (Error::Echo(..) | Error::Transfer(..)) => Status::unavailable(e.to_string()),
/// );
/// ```
#[macro_export]
macro_rules! status_from {
    ($error:ident $(, $pat:pat => $status:expr)* $(,)?) => {
        impl ::std::convert::From<$error> for ::tonic::Status {
            fn from(e: $error) -> ::tonic::Status {
                match e {
                    $error::Refused(r) => r.into(),
                    $($pat => $status,)*
                    other => ::tonic::Status::internal(other.to_string()),
                }
            }
        }
    };
}

/// The check of a service crate's mapping to statuses (for its unit test): each error becomes
/// a status with the code given and the error's own message. Panics naming the first error
/// that does not.
pub fn assert_statuses<E>(cases: impl IntoIterator<Item = (E, Code)>)
where
    E: std::fmt::Display,
    Status: From<E>,
{
    for (e, code) in cases {
        let msg = e.to_string();
        let s = Status::from(e);
        assert_eq!(s.code(), code, "{msg}");
        assert_eq!(s.message(), msg, "the status keeps the message of {msg:?}");
    }
}

/// What gma-core's own functions fail with; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A value that does not parse or lies outside its range: a duration, an instant, an event
    /// timestamp, an action name.
    #[error("{0}")]
    Value(String),
    /// A key of a role's configuration (the endpoint section, `[limits]`) or its policy file.
    #[error("{0}")]
    Config(String),
    /// A peer certificate that cannot be read or names no one.
    #[error("{0}")]
    Certificate(String),
    /// An address no connection can be made to (malformed, or TLS cannot be set up for it).
    #[error("{0}")]
    Address(String),
}

/// A bad value in a request is bad input; the others are this side's own trouble.
impl From<Error> for Refusal {
    fn from(e: Error) -> Refusal {
        let code = match e {
            Error::Value(_) => Code::InvalidArgument,
            Error::Certificate(_) => Code::Unauthenticated,
            Error::Config(_) | Error::Address(_) => Code::Internal,
        };
        Refusal::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_constructor_makes_its_code_and_the_status_keeps_the_message() {
        let cases = [
            (Refusal::invalid_argument("give a pattern"), Code::InvalidArgument),
            (Refusal::not_found("no job \"x\" here"), Code::NotFound),
            (Refusal::already_exists("held"), Code::AlreadyExists),
            (Refusal::permission_denied("may not"), Code::PermissionDenied),
            (
                Refusal::unauthenticated("present a certificate"),
                Code::Unauthenticated,
            ),
            (Refusal::resource_exhausted("slow down"), Code::ResourceExhausted),
            (
                Refusal::failed_precondition("has started"),
                Code::FailedPrecondition,
            ),
            (Refusal::aborted("the application ended"), Code::Aborted),
            (Refusal::out_of_range("compacted"), Code::OutOfRange),
            (Refusal::unavailable("directory down"), Code::Unavailable),
            (Refusal::internal("odd answer"), Code::Internal),
        ];
        for (r, code) in cases {
            assert_eq!(r.code(), code);
            let msg = r.to_string();
            assert_eq!(msg, r.message());
            let s = Status::from(r.clone());
            assert_eq!((s.code(), s.message()), (code, msg.as_str()));
            assert_eq!(Refusal::from(s), r, "a status round-trips");
        }
    }

    #[test]
    fn constructors_work_for_any_holder() {
        #[derive(Debug, thiserror::Error)]
        enum Holder {
            #[error(transparent)]
            Refused(#[from] Refusal),
        }
        let Holder::Refused(r) = Holder::not_found("nothing");
        assert_eq!((r.code(), r.message()), (Code::NotFound, "nothing"));
    }

    #[test]
    fn a_refusal_survives_serialization_as_code_name_and_message() {
        let r = Refusal::out_of_range("watch from 3: compacted up to 9; resync");
        let text = toml::to_string(&r).unwrap();
        assert_eq!(
            text.trim(),
            r#"OutOfRange = "watch from 3: compacted up to 9; resync""#
        );
        assert_eq!(toml::from_str::<Refusal>(&text).unwrap(), r);
        for code in (0..=16).map(Code::from_i32) {
            let r = Refusal::new(code, "m");
            assert_eq!(
                toml::from_str::<Refusal>(&toml::to_string(&r).unwrap()).unwrap(),
                r
            );
        }
        assert!(toml::from_str::<Refusal>("Sideways = \"m\"").is_err());
        assert!(toml::from_str::<Refusal>("NotFound = \"a\"\nInternal = \"b\"").is_err());
    }

    #[test]
    #[should_panic(expected = "down")]
    fn assert_statuses_fails_on_a_wrong_code() {
        assert_statuses([(Refusal::unavailable("down"), Code::Internal)]);
    }

    #[test]
    fn assert_statuses_passes_on_the_right_codes() {
        assert_statuses([
            (Refusal::unavailable("down"), Code::Unavailable),
            (Refusal::not_found("gone"), Code::NotFound),
        ]);
    }

    #[test]
    fn core_errors_map_to_codes() {
        let cases = [
            (
                Error::Value("duration \"x\": expected a number".into()),
                Code::InvalidArgument,
            ),
            (Error::Certificate("names no one".into()), Code::Unauthenticated),
            (
                Error::Config("limits.burst must be at least 1".into()),
                Code::Internal,
            ),
            (Error::Address("bad address x".into()), Code::Internal),
        ];
        for (e, code) in cases {
            let msg = e.to_string();
            let r = Refusal::from(e);
            assert_eq!((r.code(), r.message()), (code, msg.as_str()));
        }
    }
}
