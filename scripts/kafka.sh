#!/usr/bin/env bash
# A private single-node Apache Kafka broker (KRaft mode: broker and controller in one process) for drainpipe's
# tests and local use. No docker: the broker's jars come from Maven Central, run with `java -cp`.
#
#   scripts/kafka.sh start     fetch the jars if missing (Maven), format the storage once, start the broker on
#                              127.0.0.1:$KAFKA_PORT (controller on $KAFKA_CONTROLLER_PORT), wait until it answers;
#                              idempotent
#   scripts/kafka.sh stop      stop it (SIGTERM, then SIGKILL after 30 s); idempotent
#   scripts/kafka.sh restart   stop, then start (the same data and ports)
#   scripts/kafka.sh status    exit 0 when it is running
#   scripts/kafka.sh url       print kafka://127.0.0.1:PORT (what tests read from DRAINPIPE_TEST_KAFKA)
#   scripts/kafka.sh reset     stop it and delete its data (topics, offsets, groups)
#
# Settings (environment): KAFKA_VERSION (4.4.0: the Scala 2.13 build, kafka_2.13), KAFKA_BASE (<repo>/.kafka: the
# jars in libs/, the data in data/, server.properties, kafka.log), KAFKA_PORT (9092) and KAFKA_CONTROLLER_PORT
# (9093): when one is taken by another process, start picks a free one and records it in server.properties, where
# `url` reads it. The broker is set for fast tests: no initial rebalance delay, a 1 s minimum session timeout,
# replication factor 1 for the internal topics.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
KAFKA_BASE="${KAFKA_BASE:-$ROOT/.kafka}"
PORT_SET="${KAFKA_PORT:-}"
CPORT_SET="${KAFKA_CONTROLLER_PORT:-}"
LIBS="$KAFKA_BASE/libs-$KAFKA_VERSION"
DATA="$KAFKA_BASE/data"
CONF="$KAFKA_BASE/server.properties"
LOG="$KAFKA_BASE/kafka.log"
PIDFILE="$KAFKA_BASE/kafka.pid"

say() { echo "kafka.sh: $*" >&2; }

configured() { { grep -E "^# $1=" "$CONF" 2>/dev/null || true; } | tail -n 1 | cut -d= -f2; }

# shellcheck source=ports.sh
. "$ROOT/scripts/ports.sh"

running() {
    [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

fetch() {
    # the broker (kafka_2.13) and its runtime dependencies, by Maven from Maven Central, into $LIBS; log4j2 as
    # the broker's logger (its slf4j 1.7 binding: kafka_2.13 brings slf4j-api 1.7 and no logger)
    if [ -f "$LIBS/.complete" ]; then return; fi
    command -v mvn >/dev/null || { say "needs Maven (mvn) to fetch the broker's jars"; exit 1; }
    local work="$KAFKA_BASE/fetch"
    mkdir -p "$work"
    cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>drainpipe.tests</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>2.24.3</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>2.24.3</version>
    </dependency>
  </dependencies>
</project>
POM
    say "fetching Apache Kafka $KAFKA_VERSION's jars from Maven Central"
    rm -rf "$LIBS.tmp"
    if ! (cd "$work" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIBS.tmp") \
        >"$work/mvn.log" 2>&1; then
        say "Maven could not fetch the jars:"; tail -n 30 "$work/mvn.log" >&2; exit 1
    fi
    touch "$LIBS.tmp/.complete"
    rm -rf "$LIBS"
    mv "$LIBS.tmp" "$LIBS"
}

write_config() {
    local port="$1" cport="$2"
    cat >"$CONF" <<CONF
# written by scripts/kafka.sh (the ports below are read back by \`scripts/kafka.sh url\`)
# port=$port
# controller_port=$cport
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DATA
num.partitions=4
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
group.consumer.min.session.timeout.ms=1000
group.consumer.min.heartbeat.interval.ms=500
log.flush.interval.messages=9223372036854775807
CONF
    cat >"$KAFKA_BASE/log4j2.yaml" <<'LOG4J'
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
LOG4J
}

JAVA_OPTS=(-Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true)

java_cmd() {
    java "${JAVA_OPTS[@]}" -Dlog4j2.configurationFile="$KAFKA_BASE/log4j2.yaml" -cp "$LIBS/*" "$@"
}

start() {
    mkdir -p "$KAFKA_BASE"
    if running; then return; fi
    fetch
    local port cport
    port="${PORT_SET:-$(configured port)}"; port="${port:-9092}"
    cport="${CPORT_SET:-$(configured controller_port)}"; cport="${cport:-9093}"
    if port_taken "$port"; then local was="$port"; port="$(free_port)"; say "port $was is taken: using $port"; fi
    if port_taken "$cport" || [ "$cport" = "$port" ]; then
        local was="$cport"; cport="$(free_port)"; say "controller port $was is taken: using $cport"
    fi
    write_config "$port" "$cport"
    if [ ! -f "$DATA/meta.properties" ]; then
        local cluster
        # (an id that starts with "-" reads as an option to the tool: 1 in 64 of them failed the install; Kafka's own
        # random ids avoid it the same way)
        cluster="$(python3 -c 'import base64, uuid
while True:
    c = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not c.startswith("-"):
        print(c)
        break')"
        mkdir -p "$DATA"
        java_cmd kafka.tools.StorageTool format -t "$cluster" -c "$CONF" >>"$LOG" 2>&1 \
            || { say "formatting the storage failed:"; tail -n 20 "$LOG" >&2; exit 1; }
    fi
    # its own session, so that nothing signalling the caller's process group (make, a test run) stops it
    (cd "$KAFKA_BASE" && exec setsid java "${JAVA_OPTS[@]}" -Dlog4j2.configurationFile="$KAFKA_BASE/log4j2.yaml" \
        -cp "$LIBS/*" kafka.Kafka "$CONF" >>"$LOG" 2>&1 </dev/null) &
    echo $! >"$PIDFILE"
    # up when it answers on its port (a TCP connect: the broker listens once it has joined its own quorum)
    for _ in $(seq 1 240); do
        if ! running; then say "the broker exited:"; tail -n 30 "$LOG" >&2; exit 1; fi
        if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 0.5)" 2>/dev/null; then
            say "running on 127.0.0.1:$port (controller $cport), data in $DATA"
            return
        fi
        sleep 0.25
    done
    say "the broker did not answer within 60 s:"; tail -n 30 "$LOG" >&2; exit 1
}

stop() {
    if ! running; then rm -f "$PIDFILE"; return; fi
    local pid; pid="$(cat "$PIDFILE")"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 120); do
        if ! kill -0 "$pid" 2>/dev/null; then rm -f "$PIDFILE"; return; fi
        sleep 0.25
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    status) running ;;
    url) port="$(configured port)"; echo "kafka://127.0.0.1:${port:-${PORT_SET:-9092}}" ;;
    reset) stop; rm -rf "$DATA" "$CONF" ;;
    *) echo "usage: $0 start|stop|restart|status|url|reset" >&2; exit 2 ;;
esac
