-- A snapshot's state is stored zlib-compressed (bytea), not as jsonb:
-- binding a large fleet's views as text copied tens of megabytes at once
-- (see llmgw-eventstore's snapshot_zip.rs). Snapshots are a cache, never
-- the truth, so the old ones are dropped rather than converted: the first
-- start after this migration replays the log once and snapshots anew. The
-- table itself is kept (and with it any grants on it); the conversion of
-- the emptied column only has to type-check.
TRUNCATE es_snapshots;
ALTER TABLE es_snapshots
    ALTER COLUMN state TYPE bytea USING convert_to(state::text, 'UTF8');
