//! The OpenAI-compatible data plane: authentication, admission by priority
//! band, endpoint choice, the streaming proxy and usage capture.
//!
//! What must not: blocking a request on the database. Everything a request
//! needs is read from in-memory projections; usage leaves the request path
//! through a bounded queue.
