// kafkajs, unchanged, against futoin-evt's Kafka door (SASL PLAIN without TLS).
// Usage: node kafka_kafkajs.js '{"broker": "127.0.0.1:PORT", "user": ..., "password": ...,
//     "topic": "events", "produce": [{"key": ..., "value": ..., "headers": {...}}],
//     "group": "G", "count": N}'
// Produces `produce` (if any) in one gzip batch with an idempotent producer and prints
// {"produced": [{"partition": ..., "offset": ...}]}; then, with `group`, consumes `count`
// records in that consumer group from the beginning, printing one line per record
// {"partition", "offset", "key", "value", "headers": [[name, value]...]} (keys, values and
// header values in base64, null for none), commits their offsets and prints
// {"committed": [{"partition", "offset"}]} as the group's offsets read back; then disconnects.
"use strict";

const { CompressionTypes, Kafka, Partitioners, logLevel } = require("kafkajs");

const scenario = JSON.parse(process.argv[2]);
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");
const base64 = (buffer) => (buffer == null ? null : Buffer.from(buffer).toString("base64"));

const kafka = new Kafka({
    clientId: "futoin-evt-tests",
    brokers: [scenario.broker],
    sasl: { mechanism: "plain", username: scenario.user, password: scenario.password },
    ssl: false,
    // stdout carries the JSON lines: the log goes to stderr
    logLevel: logLevel.WARN,
    logCreator: () => ({ namespace, log }) =>
        process.stderr.write(`${namespace}: ${log.message} ${JSON.stringify(log)}\n`),
});

async function produce() {
    const producer = kafka.producer({
        idempotent: true,
        maxInFlightRequests: 1,
        createPartitioner: Partitioners.DefaultPartitioner,
    });
    await producer.connect();
    try {
        const sent = await producer.send({
            topic: scenario.topic,
            compression: CompressionTypes.GZIP,
            acks: -1,
            messages: scenario.produce,
        });
        say({ produced: sent.map((r) => ({ partition: r.partition, offset: Number(r.baseOffset) })) });
    } finally {
        await producer.disconnect();
    }
}

function headerPairs(headers) {
    const pairs = [];
    for (const [name, value] of Object.entries(headers || {})) {
        for (const one of Array.isArray(value) ? value : [value]) {
            pairs.push([name, base64(one)]);
        }
    }
    return pairs;
}

async function consume() {
    const consumer = kafka.consumer({ groupId: scenario.group, maxWaitTimeInMs: 100 });
    await consumer.connect();
    try {
        await consumer.subscribe({ topics: [scenario.topic], fromBeginning: true });
        const next = {};
        await new Promise((resolve, reject) => {
            let received = 0;
            consumer
                .run({
                    autoCommit: false,
                    eachMessage: async ({ partition, message }) => {
                        if (received >= scenario.count) {
                            return;
                        }
                        received += 1;
                        say({
                            partition,
                            offset: Number(message.offset),
                            key: base64(message.key),
                            value: base64(message.value),
                            headers: headerPairs(message.headers),
                        });
                        next[partition] = String(Number(message.offset) + 1);
                        if (received === scenario.count) {
                            resolve();
                        }
                    },
                })
                .catch(reject);
        });
        await consumer.commitOffsets(
            Object.entries(next).map(([partition, offset]) => ({
                topic: scenario.topic,
                partition: Number(partition),
                offset,
            })),
        );
    } finally {
        await consumer.disconnect();
    }
    const admin = kafka.admin();
    await admin.connect();
    try {
        const [{ partitions }] = await admin.fetchOffsets({
            groupId: scenario.group,
            topics: [scenario.topic],
        });
        say({
            committed: partitions.map((p) => ({ partition: p.partition, offset: Number(p.offset) })),
        });
    } finally {
        await admin.disconnect();
    }
}

async function main() {
    if (scenario.produce && scenario.produce.length) {
        await produce();
    }
    if (scenario.group) {
        await consume();
    }
}

main().catch((error) => {
    process.stderr.write(`${error.stack || error}\n`);
    process.exit(1);
});
