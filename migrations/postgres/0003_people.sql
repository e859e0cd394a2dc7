-- People who sign in: personal data, password hashes, browser sessions and
-- key claim links. Kept out of the append-only event log, which holds only a
-- person's id and state, so that erasing a person really removes their data.
CREATE TABLE people (
    user_id       text        PRIMARY KEY,
    -- Trimmed and lower-cased before it gets here, so uniqueness ignores case.
    email         text        NOT NULL UNIQUE,
    name          text        NOT NULL,
    password_hash text        NOT NULL,
    created_at    timestamptz NOT NULL,
    last_login_at timestamptz
);

-- Only SHA-256 hashes of the cookie and CSRF tokens: a copy of this table
-- opens no session. Idle expiry is last_seen_at + the configured idle time;
-- expires_at is the absolute end however busy the session is.
CREATE TABLE people_sessions (
    token_hash   text        PRIMARY KEY,
    user_id      text        NOT NULL,
    csrf_hash    text        NOT NULL,
    created_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX people_sessions_user_id ON people_sessions (user_id);

-- A key's secret sealed under its link token, which is never stored (only
-- its hash, to find the row). Claiming wipes the sealed copy in the same
-- statement, so a claimed row can never still hold a secret.
CREATE TABLE key_claims (
    token_hash text        PRIMARY KEY,
    key_id     text        NOT NULL,
    sealed     bytea,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    claimed_at timestamptz,
    CHECK (claimed_at IS NULL OR sealed IS NULL)
);
