-- A note's words as SQLite's unicode61 tokenizer finds them: PostgreSQL's
-- parser kept `example.com`, `ops@acme.io`, `v1.2.3`, `3.14` and paths
-- whole, and kept accents, so the same search found a note on SQLite and
-- not here. Punctuation becomes a space and Latin letters lose their
-- accents (the same table as llmgw_convo::limits::FOLD_FROM and FOLD_TO),
-- upper case included, as lower() may leave it under the C locale.
DROP INDEX convo_notes_search;
ALTER TABLE convo_notes DROP COLUMN search;
ALTER TABLE convo_notes ADD COLUMN search tsvector GENERATED ALWAYS AS (
    to_tsvector('simple', translate(lower(key || ' ' || body),
        '!"#$%&''()*+,-./:;<=>?@[\]^_`{|}~áàâäãåāçćčéèêëēěíìîïīñńňóòôöõōśšşúùûüūůýÿźžżğřťďÁÀÂÄÃÅĀÇĆČÉÈÊËĒĚÍÌÎÏĪÑŃŇÓÒÔÖÕŌŚŠŞÚÙÛÜŪŮÝŸŹŽŻĞŘŤĎ',
        '                                aaaaaaaccceeeeeeiiiiinnnoooooosssuuuuuuyyzzzgrtdaaaaaaaccceeeeeeiiiiinnnoooooosssuuuuuuyyzzzgrtd'))
) STORED;
CREATE INDEX convo_notes_search ON convo_notes USING gin (search);
