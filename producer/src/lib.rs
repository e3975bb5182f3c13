//! gma-producer
