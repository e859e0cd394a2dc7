-- What the gateway keeps of conversations, for projects that switched it on
-- (ThreadsSet, MemorySet in the log): thread turns and memory notes. Kept
-- out of the append-only event log so that they can be deleted: by the
-- client, by the retention sweep, or when a project switches them off.
-- Instants are bigint microseconds since the Unix epoch, as on SQLite, so
-- both backends share one set of queries' shapes. project_id '' is the
-- shared, ownerless pool of a gateway without keys.

CREATE TABLE convo_threads (
    project_id text   NOT NULL,
    thread_id  text   NOT NULL,
    created_at bigint NOT NULL,
    -- The last write: retention is measured from here.
    updated_at bigint NOT NULL,
    next_seq   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, thread_id)
);
CREATE INDEX convo_threads_updated ON convo_threads (project_id, updated_at);

-- One message of a thread, as the chat API's JSON object.
CREATE TABLE convo_turns (
    project_id text   NOT NULL,
    thread_id  text   NOT NULL,
    seq        bigint NOT NULL,
    message    text   NOT NULL,
    PRIMARY KEY (project_id, thread_id, seq),
    FOREIGN KEY (project_id, thread_id)
        REFERENCES convo_threads (project_id, thread_id) ON DELETE CASCADE
);

CREATE TABLE convo_notes (
    project_id text   NOT NULL,
    agent      text   NOT NULL,
    key        text   NOT NULL,
    body       text   NOT NULL,
    -- A JSON array of tags.
    tags       jsonb  NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    -- 'simple': no stemming, so a search finds what SQLite's unicode61
    -- tokenizer finds for the same words.
    search     tsvector GENERATED ALWAYS AS (to_tsvector('simple', key || ' ' || body)) STORED,
    PRIMARY KEY (project_id, agent, key)
);
CREATE INDEX convo_notes_search ON convo_notes USING gin (search);
CREATE INDEX convo_notes_tags ON convo_notes USING gin (tags);
CREATE INDEX convo_notes_updated ON convo_notes (project_id, updated_at);
