//! The codec of every generated service: prost, except that a message that is not a valid
//! protobuf of its type is `INVALID_ARGUMENT` (the sender's fault, and asking again with the
//! same bytes gets the same answer), where tonic-prost answers `INTERNAL`. Encoding is
//! tonic-prost's.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;

/// `tonic_prost::ProstCodec` with [`ProstDecoder`].
#[derive(Debug, Clone)]
pub struct ProstCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for ProstCodec<T, U> {
    fn default() -> Self {
        ProstCodec { _pd: PhantomData }
    }
}

impl<T, U> Codec for ProstCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder { _pd: PhantomData }
    }
}

/// The status of a message that is not a valid protobuf of its method's type:
/// `INVALID_ARGUMENT` with prost's reason (also what a client that reads its responses' frames
/// itself answers, e.g. `gma_consumer`'s subscriptions).
pub fn not_a_message(e: prost::DecodeError) -> Status {
    Status::invalid_argument(format!(
        "{e}: the message is not a valid protobuf of this method's type; send one encoded from the gma .proto files"
    ))
}

/// Decodes a `U`; an undecodable message is `INVALID_ARGUMENT` with prost's reason.
#[derive(Debug, Clone)]
pub struct ProstDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for ProstDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(not_a_message)
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
