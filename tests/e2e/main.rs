//! End-to-end tests (filled in by the front-end work).
