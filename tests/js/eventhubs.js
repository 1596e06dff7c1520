// The Azure Event Hubs SDK for JavaScript, unchanged, against futoin-evt's AMQP listener.
// Usage: node eventhubs.js '{"connectionString": ..., "keys": [...], "perKey": N}'
// Prints JSON lines: the partition ids, then every event received over all partitions
// ({"all": ...}), then those of partition 1 after sequence number 2 ({"one": ...}).
"use strict";

const { EventHubConsumerClient, EventHubProducerClient, earliestEventPosition } =
    require("@azure/event-hubs");

const scenario = JSON.parse(process.argv[2]);
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");

function receive(client, count, ...where) {
    return new Promise((resolve, reject) => {
        const events = [];
        const subscription = client.subscribe(...where, {
            processEvents: async (received, context) => {
                for (const event of received) {
                    events.push({
                        partition: context.partitionId,
                        sequence: event.sequenceNumber,
                        offset: event.offset,
                        body: event.body,
                    });
                }
                if (events.length >= count) {
                    await subscription.close();
                    resolve(events);
                }
            },
            processError: async (error) => {
                await subscription.close();
                reject(error);
            },
        }, { startPosition: where.length ? { sequenceNumber: 2 } : earliestEventPosition,
             maxWaitTimeInSeconds: 1 });
    });
}

async function main() {
    const producer = new EventHubProducerClient(scenario.connectionString);
    say({ ids: await producer.getPartitionIds() });
    for (const key of scenario.keys) {
        const batch = await producer.createBatch({ partitionKey: key });
        for (let n = 0; n < scenario.perKey; n++) {
            batch.tryAdd({ body: { key, n } });
        }
        await producer.sendBatch(batch);
    }
    const toOne = await producer.createBatch({ partitionId: "1" });
    for (let n = 0; n < 5; n++) {
        toOne.tryAdd({ body: { partition: "1", n } });
    }
    await producer.sendBatch(toOne);
    await producer.close();

    const consumer = new EventHubConsumerClient("$Default", scenario.connectionString);
    const total = scenario.keys.length * scenario.perKey + 5;
    say({ all: await receive(consumer, total) });
    const properties = await consumer.getPartitionProperties("1");
    say({ one: await receive(consumer, properties.lastEnqueuedSequenceNumber - 2, "1") });
    await consumer.close();
}

main().catch((error) => {
    process.stderr.write(String(error && error.stack || error) + "\n");
    process.exit(1);
});
