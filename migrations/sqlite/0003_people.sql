-- See postgres/0003_people.sql. Timestamps are INTEGER microseconds since
-- the Unix epoch.
CREATE TABLE people (
    user_id       TEXT    PRIMARY KEY,
    email         TEXT    NOT NULL UNIQUE,
    name          TEXT    NOT NULL,
    password_hash TEXT    NOT NULL,
    created_at    INTEGER NOT NULL,
    last_login_at INTEGER
) STRICT;

CREATE TABLE people_sessions (
    token_hash   TEXT    PRIMARY KEY,
    user_id      TEXT    NOT NULL,
    csrf_hash    TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX people_sessions_user_id ON people_sessions (user_id);

CREATE TABLE key_claims (
    token_hash TEXT    PRIMARY KEY,
    key_id     TEXT    NOT NULL,
    sealed     BLOB,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    claimed_at INTEGER,
    CHECK (claimed_at IS NULL OR sealed IS NULL)
) STRICT;
