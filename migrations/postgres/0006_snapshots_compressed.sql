-- A snapshot's state is stored zlib-compressed (bytea), not as jsonb:
-- binding a large fleet's views as text copied tens of megabytes at once
-- (see llmgw-eventstore's snapshot_zip.rs). Snapshots are a cache, never
-- the truth, so the old ones are dropped rather than converted: the first
-- start after this migration replays the log once and snapshots anew.
DROP TABLE es_snapshots;
CREATE TABLE es_snapshots (
    name          text        PRIMARY KEY,
    position      bigint      NOT NULL CHECK (position >= 0),
    event_id      uuid,
    state_version integer     NOT NULL,
    state         bytea       NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
