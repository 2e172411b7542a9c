package idemlog.bench;

import java.io.BufferedInputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Benchmark probe, not a product reader: Arrow IPC stream files ({@code *.arrows} under the
 * option {@code path}, one Spark task each) handed to Spark as a columnar DataSource V2 scan.
 * It measures what a JVM-side idemlog reader could read at if its fetched Arrow batches
 * reached Spark's vectorized operators as they are, which a Python data source cannot do in
 * Spark 4.1 (benchmarks/README.md, "Reads"). The schema is bench-peers' rows: {@code id
 * bigint, key int, value string}.
 */
public final class ArrowScan implements TableProvider {
  static final StructType SCHEMA =
      new StructType()
          .add("id", DataTypes.LongType)
          .add("key", DataTypes.IntegerType)
          .add("value", DataTypes.StringType);

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    String path = properties.get("path");
    if (path == null) {
      throw new IllegalArgumentException("ArrowScan needs the option path (a folder of *.arrows)");
    }
    return new ArrowTable(path);
  }

  record FilePartition(String file) implements InputPartition {}

  static final class ArrowTable implements SupportsRead {
    private final String path;

    ArrowTable(String path) {
      this.path = path;
    }

    @Override
    public String name() {
      return "arrow-scan:" + path;
    }

    // Deprecated for columns(), which Spark 4.1 derives from it; it is still abstract.
    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return Set.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return () -> new ArrowFilesScan(path);
    }
  }

  static final class ArrowFilesScan implements Scan, Batch {
    private final String path;

    ArrowFilesScan(String path) {
      this.path = path;
    }

    @Override
    public StructType readSchema() {
      return SCHEMA;
    }

    @Override
    public Batch toBatch() {
      return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
      try (Stream<Path> files = Files.list(Path.of(path))) {
        List<Path> arrows =
            files.filter(f -> f.toString().endsWith(".arrows")).sorted().toList();
        if (arrows.isEmpty()) {
          throw new IllegalArgumentException("no *.arrows file under path=" + path);
        }
        return arrows.stream().map(f -> new FilePartition(f.toString())).toArray(InputPartition[]::new);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new ColumnarFactory();
    }
  }

  static final class ColumnarFactory implements PartitionReaderFactory {
    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<org.apache.spark.sql.catalyst.InternalRow> createReader(
        InputPartition partition) {
      throw new UnsupportedOperationException("ArrowScan reads columnar batches only");
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      try {
        return new BatchReader(((FilePartition) partition).file());
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
  }

  /** One file's record batches, each handed to Spark as the vectors Arrow loaded it into. */
  static final class BatchReader implements PartitionReader<ColumnarBatch> {
    private final BufferAllocator allocator = new RootAllocator();
    private final ArrowStreamReader reader;
    private ColumnarBatch batch;

    BatchReader(String file) throws IOException {
      reader =
          new ArrowStreamReader(
              new BufferedInputStream(Files.newInputStream(Path.of(file)), 1 << 20), allocator);
    }

    @Override
    public boolean next() throws IOException {
      if (!reader.loadNextBatch()) {
        return false;
      }
      VectorSchemaRoot root = reader.getVectorSchemaRoot();
      ColumnVector[] columns =
          root.getFieldVectors().stream().map(ArrowColumnVector::new).toArray(ColumnVector[]::new);
      batch = new ColumnarBatch(columns, root.getRowCount());
      return true;
    }

    @Override
    public ColumnarBatch get() {
      return batch;
    }

    @Override
    public void close() throws IOException {
      reader.close();
      allocator.close();
    }
  }
}
