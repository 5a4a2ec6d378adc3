-- A short summary of what a job wrote: windows, late events, dead letters, and the accounting
-- that every message landed exactly once.
SELECT count(*) AS windows, count(DISTINCT key) AS keys, sum(count) AS events_in_windows,
       round(sum(sum_value), 2) AS total_value,
       min(window_start_ms) AS first_window_ms, max(window_end_ms) AS last_window_end_ms
FROM windows;

SELECT count(*) AS late_events,
       round(avg(watermark_ms - event_time_ms)) AS avg_ms_behind_watermark,
       count(DISTINCT partition) AS partitions
FROM late_events;

SELECT error, count(*) AS dead_letters FROM dead_letters GROUP BY error ORDER BY 2 DESC;

SELECT (SELECT sum(count) FROM windows) AS in_windows,
       (SELECT count(*) FROM late_events) AS late,
       (SELECT count(*) FROM dead_letters) AS dead,
       (SELECT sum(count) FROM windows) + (SELECT count(*) FROM late_events)
         + (SELECT count(*) FROM dead_letters) AS accounted_for;

SELECT job, partition, regexp_extract(file, '[^/]+$') AS file, next_offset, partition_watermark_ms,
       global_watermark_ms, open_windows, lag
FROM streaming_etl_checkpoint() ORDER BY partition;
