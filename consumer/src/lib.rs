//! gma-consumer
