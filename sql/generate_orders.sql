-- Writes an order stream into NDJSON files, one file per partition (message i goes to partition
-- i % ${partitions}; event time = ${base_ms} + i): a key k{i % 50} as the predecessor's, a region
-- (5) and an item sku (20) for composite keys, a customer who is active in bursts of 100
-- consecutive orders then quiet for the next 99,900 (sessions), an amount (0-100), a status and
-- a coupon on a tenth of the orders. Placeholders are filled in by scripts (string.Template).
COPY (
  SELECT '{"key":"k' || (i % 50) || '","event_time_ms":' || (${base_ms} + i) ||
         ',"region":"r' || (i % 5) || '","item":{"sku":"s' || (i % 20) || '"}' ||
         ',"customer":{"id":"c' || ((i // 100) % 1000) || '"}' ||
         ',"amount":' || round((hash(i, ${seed}, 'amount') % 10001) / 100.0, 2) ||
         ',"status":"' || (['new', 'paid', 'sent'])[1 + (hash(i, ${seed}, 'status') % 3)::INTEGER] || '"' ||
         CASE WHEN i % 10 = 0 THEN ',"coupon":"C' || (i % 7) || '"' ELSE '' END ||
         ',"payload":{"value":' || round((hash(i, ${seed}, 'value') % 10001) / 100.0, 2) || '}}' AS line
  FROM range(${p}, ${events}, ${partitions}) t(i)
  ORDER BY i
) TO '${path}' (FORMAT csv, HEADER false, QUOTE '', ESCAPE '', DELIMITER '\x01');
