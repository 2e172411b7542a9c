// Kafka's own Java producer (kafka-clients), idempotent, for test_kafka_java_producer.py:
// sends COUNT values "j<i>" to PARTITIONS partitions (value i to partition i % PARTITIONS)
// of TOPIC at BOOTSTRAP, then prints one line per acknowledged record,
// "acked <partition> <offset> <value>", and exits 0; a send that failed prints
// "failed <value> <exception>" and the program exits 1. COMPRESSION: the producer's
// compression.type (none, gzip, snappy, lz4, zstd).
// Usage: java -cp <kafka jars> KafkaIdempotentProducer.java BOOTSTRAP TOPIC COUNT PARTITIONS
//        COMPRESSION

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KafkaIdempotentProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        int partitions = Integer.parseInt(args[3]);
        String compression = args[4];
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, compression);
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, "256"); // many small batches, many requests
        props.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "1000"); // below the proxy's stall
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
        props.put(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, "50");
        props.put(ProducerConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, "200");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        List<String> failed = Collections.synchronizedList(new ArrayList<>());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (int i = 0; i < count; i++) {
                String value = "j" + i + "-" + "x".repeat(40); // something to compress
                sent.add(producer.send(
                    new ProducerRecord<>(topic, i % partitions, null, value.getBytes()),
                    (meta, error) -> {
                        if (error != null) {
                            failed.add("failed " + value + " " + error);
                        }
                    }));
            }
            producer.flush();
        }
        StringBuilder out = new StringBuilder();
        for (int i = 0; i < count; i++) {
            try {
                RecordMetadata meta = sent.get(i).get();
                out.append("acked ").append(meta.partition()).append(' ')
                    .append(meta.offset()).append(" j").append(i).append("-").append("x".repeat(40))
                    .append('\n');
            } catch (Exception e) {
                // the callback said why
            }
        }
        for (String line : failed) {
            out.append(line).append('\n');
        }
        System.out.print(out);
        System.exit(failed.isEmpty() ? 0 : 1);
    }
}
