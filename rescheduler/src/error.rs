//! The rescheduler's one error type and its one mapping to gRPC status codes (model:
//! `gma_directory::error`). The rescheduler serves no RPC of its own (its doors are its
//! producer's); the mapping says what each failure would be on the wire, and keeps one
//! convention across the roles.

use tonic::Status;

/// Everything the rescheduler can fail with. Messages are lowercase, carry no trailing period
/// and say what to do; the variant picks the gRPC code (`impl From<Error> for Status`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The application's control endpoint is missing, unreachable or refused the call.
    /// UNAVAILABLE.
    #[error("{0}")]
    Unreachable(String),
    /// An action command failed, timed out or could not be started. INTERNAL.
    #[error("{0}")]
    Action(String),
    /// The configuration is invalid (never reaches a client). INTERNAL.
    #[error("invalid rescheduler config: {0}")]
    Config(String),
    /// The role's embedded producer failed (never reaches a client). INTERNAL.
    #[error("producer: {0}")]
    Producer(String),
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let msg = e.to_string();
        match e {
            Error::Unreachable(_) => Status::unavailable(msg),
            Error::Action(_) | Error::Config(_) | Error::Producer(_) => Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn each_variant_maps_to_its_code_and_keeps_its_message() {
        let cases = [
            (
                Error::Unreachable("cannot reach app1 at x".into()),
                Code::Unavailable,
            ),
            (Error::Action("command \"exit 3\" failed".into()), Code::Internal),
            (Error::Config("directory".into()), Code::Internal),
            (Error::Producer("bind".into()), Code::Internal),
        ];
        gma_core::assert_statuses(cases);
        assert_eq!(
            Status::from(Error::Config("x".into())).message(),
            "invalid rescheduler config: x"
        );
    }
}
