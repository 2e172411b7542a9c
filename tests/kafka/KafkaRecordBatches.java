// Kafka's own record-batch code (kafka-clients, from jars/kafka-broker) driven by
// tests/kafka/test_kafka_java_records.py: it writes batches from a record list and a
// transaction marker, and dumps what it reads from a file of batches, one line per batch
// and per record, every byte string in hex ("-" for null). Run as a single-file program
// (one JVM for all the work: each line of the commands file is one command):
// java -cp 'jars/kafka-broker/*' tests/kafka/KafkaRecordBatches.java <commands file>
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;

import org.apache.kafka.common.compress.Compression;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.record.ControlRecordType;
import org.apache.kafka.common.record.EndTransactionMarker;
import org.apache.kafka.common.record.MemoryRecords;
import org.apache.kafka.common.record.MemoryRecordsBuilder;
import org.apache.kafka.common.record.Record;
import org.apache.kafka.common.record.RecordBatch;
import org.apache.kafka.common.record.TimestampType;

public class KafkaRecordBatches {
    private static final HexFormat HEX = HexFormat.of();

    private static byte[] bytesOrNull(String hex) {
        return hex.equals("-") ? null : HEX.parseHex(hex);
    }

    private static String hexOrDash(ByteBuffer buffer) {
        if (buffer == null) return "-";
        byte[] bytes = new byte[buffer.remaining()];
        buffer.duplicate().get(bytes);
        return HEX.formatHex(bytes);
    }

    private static void write(Path spec, Path out, long baseOffset, int leaderEpoch, long producerId,
                              short producerEpoch, int baseSequence, boolean transactional) throws Exception {
        ByteBuffer buffer = ByteBuffer.allocate(64 << 20);
        MemoryRecordsBuilder builder = MemoryRecords.builder(buffer, RecordBatch.MAGIC_VALUE_V2,
            Compression.NONE, TimestampType.CREATE_TIME, baseOffset, RecordBatch.NO_TIMESTAMP,
            producerId, producerEpoch, baseSequence, transactional, leaderEpoch);
        for (String line : Files.readAllLines(spec, StandardCharsets.UTF_8)) {
            String[] fields = line.split("\t", -1);
            List<Header> headers = new ArrayList<>();
            if (!fields[3].isEmpty()) {
                for (String pair : fields[3].split(",")) {
                    String[] kv = pair.split(":", -1);
                    headers.add(new RecordHeader(new String(HEX.parseHex(kv[0]), StandardCharsets.UTF_8),
                        bytesOrNull(kv[1])));
                }
            }
            builder.append(Long.parseLong(fields[0]), bytesOrNull(fields[1]), bytesOrNull(fields[2]),
                headers.toArray(new Header[0]));
        }
        ByteBuffer built = builder.build().buffer();
        byte[] bytes = new byte[built.remaining()];
        built.get(bytes);
        Files.write(out, bytes);
    }

    private static void marker(Path out, short type, long baseOffset, int leaderEpoch, long producerId,
                               short producerEpoch, int coordinatorEpoch, long timestamp) throws Exception {
        ControlRecordType controlType = type == 0 ? ControlRecordType.ABORT : ControlRecordType.COMMIT;
        ByteBuffer built = MemoryRecords.withEndTransactionMarker(baseOffset, timestamp, leaderEpoch,
            producerId, producerEpoch, new EndTransactionMarker(controlType, coordinatorEpoch)).buffer();
        byte[] bytes = new byte[built.remaining()];
        built.get(bytes);
        Files.write(out, bytes);
    }

    private static void dump(Path in) throws Exception {
        MemoryRecords records = MemoryRecords.readableRecords(ByteBuffer.wrap(Files.readAllBytes(in)));
        for (RecordBatch batch : records.batches()) {
            batch.ensureValid();  // the CRC, recomputed by Kafka
            System.out.printf("batch base=%d last=%d epoch=%d magic=%d compression=%s tstype=%s "
                    + "transactional=%b control=%b pid=%d pepoch=%d seq=%d max=%d count=%d%n",
                batch.baseOffset(), batch.lastOffset(), batch.partitionLeaderEpoch(), batch.magic(),
                batch.compressionType().name, batch.timestampType(), batch.isTransactional(),
                batch.isControlBatch(), batch.producerId(), batch.producerEpoch(), batch.baseSequence(),
                batch.maxTimestamp(), batch.countOrNull());
            for (Record record : batch) {
                record.ensureValid();
                StringBuilder headers = new StringBuilder();
                for (Header header : record.headers()) {
                    if (headers.length() > 0) headers.append(',');
                    headers.append(HEX.formatHex(header.key().getBytes(StandardCharsets.UTF_8))).append(':')
                        .append(header.value() == null ? "-" : HEX.formatHex(header.value()));
                }
                System.out.printf("record %d %d %s %s %s%n", record.offset(), record.timestamp(),
                    hexOrDash(record.key()), hexOrDash(record.value()), headers);
            }
        }
    }

    private static void run(String[] args) throws Exception {
        switch (args[0]) {
            case "write" -> write(Path.of(args[1]), Path.of(args[2]), Long.parseLong(args[3]),
                Integer.parseInt(args[4]), Long.parseLong(args[5]), Short.parseShort(args[6]),
                Integer.parseInt(args[7]), args[8].equals("1"));
            case "marker" -> marker(Path.of(args[1]), Short.parseShort(args[2]), Long.parseLong(args[3]),
                Integer.parseInt(args[4]), Long.parseLong(args[5]), Short.parseShort(args[6]),
                Integer.parseInt(args[7]), Long.parseLong(args[8]));
            case "dump" -> {
                System.out.println("dump " + args[1]);
                dump(Path.of(args[1]));
            }
            default -> throw new IllegalArgumentException("command " + args[0]);
        }
    }

    public static void main(String[] args) throws Exception {
        for (String line : Files.readAllLines(Path.of(args[0]), StandardCharsets.UTF_8)) {
            if (!line.isBlank()) run(line.split(" "));
        }
    }
}
