-- profile_metrics' bytes per user-day: the exactly-once key's entries narrower, the identity key's pages full.
--
-- A B-tree entry is an 8-byte header and the key columns, each at an offset aligned to its own width, the whole
-- rounded up to 8 bytes, plus a 4-byte line pointer on its page. (metrics_date, user_id, version) is a 4-byte date,
-- 4 bytes of padding before the bigint, 8 and 4: 28 bytes rounded to 32, 36 with its line pointer. Ordered
-- (metrics_date, version, user_id) the two 4-byte columns share the first 8 bytes: 24, 28 with its line pointer,
-- 22 % less. It is the same constraint on the same columns: every write names all three (ON CONFLICT, the recompute
-- and settings checks) and finds its row in one probe as before; a date's rows still lie together (retention
-- reads them per formula version, a date holds one or two).
--
-- profile_metrics_pkey holds identity values, which only grow: its pages fill from the right and are never
-- inserted into again, except by an update that changes an indexed column (a settings change moving computed_at,
-- a few rows a day). Packed to 100 % instead of 90 % it is 10 % smaller; a later entry on a full page splits it.
--
-- Locks: the new index is built before the old one is dropped, under a SHARE lock (reads go on, writes wait for the
-- build: about a minute per 50 million rows on 2 cores); the drop and rename take an ACCESS EXCLUSIVE lock until
-- the migration commits, right after. The fill factor takes a SHARE UPDATE EXCLUSIVE lock on the index only (no
-- read or write waits) and applies to pages split from now on.
CREATE UNIQUE INDEX profile_metrics_date_version_user_key ON profile_metrics (metrics_date, version, user_id);
DROP INDEX profile_metrics_date_user_version_key;
ALTER INDEX profile_metrics_pkey SET (fillfactor = 100);
