-- Writes the predecessor's workload into NDJSON files, one file per partition: message i goes
-- to partition i % ${partitions}; event time = ${base_ms} + i; about ${late_pct}% of the events are
-- shifted 2-5 windows of ${window_ms} ms back (late); about ${bad_permille} per mille of the
-- lines are malformed; partition ${skew_partition} runs ${skew_ms} ms behind in event time;
-- key k{i % ${keys}}; value uniform 0-100. The time is an integer, or (time_open/time_close set to
-- an strftime call) ISO 8601 text. Injected late events carry "late":1 (benchmarks count
-- false-late events with it). Placeholders are filled in by scripts (Python string.Template),
-- run once per partition (p = ${p}).
COPY (
  SELECT CASE
           WHEN hash(i, ${seed}, 'bad') % 1000 < ${bad_permille} THEN '{"key": broken'
           ELSE '{"key":"k' || (i % ${keys}) || '","event_time_ms":' ||
                ${time_open}(${base_ms} + i
                   - CASE WHEN ${p} = ${skew_partition} THEN ${skew_ms} ELSE 0 END
                   - CASE WHEN late THEN ${window_ms} * (2 + hash(i, ${seed}, 'shift') % 4) ELSE 0 END)${time_close} ||
                ',"payload":{"value":' || round((hash(i, ${seed}, 'value') % 10001) / 100.0, 2) || '}' ||
                CASE WHEN late THEN ',"late":1}' ELSE '}' END
         END AS line
  FROM (SELECT i, hash(i, ${seed}, 'late') % 10000 < ${late_pct} * 100 AS late
        FROM range(${p}, ${events}, ${partitions}) t(i))
  ORDER BY i
) TO '${path}' (FORMAT csv, HEADER false, QUOTE '', ESCAPE '', DELIMITER '\x01');
