// The Azure Event Hubs SDK for JavaScript, unchanged, with a connection string whose policy may
// or may not use its hub. Usage: node eventhubs_rights.js '{"connectionString": ..., "count": N}'
// Sends N events and receives them from the earliest over every partition; prints
// {"ids": [...]}, then {"received": [...bodies]}; or, when the SDK fails,
// {"error": name, "code": code, "message": message} (and exits 0: the refusal is the answer).
"use strict";

const { EventHubConsumerClient, EventHubProducerClient, earliestEventPosition } =
    require("@azure/event-hubs");

const scenario = JSON.parse(process.argv[2]);
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");
// No retries: a refusal is answered at once.
const options = { retryOptions: { maxRetries: 0, timeoutInMs: 30000 } };

function receive(client, count) {
    return new Promise((resolve, reject) => {
        const bodies = [];
        const subscription = client.subscribe({
            processEvents: async (received) => {
                for (const event of received) {
                    bodies.push(event.body);
                }
                if (bodies.length >= count) {
                    await subscription.close();
                    resolve(bodies);
                }
            },
            processError: async (error) => {
                await subscription.close();
                reject(error);
            },
        }, { startPosition: earliestEventPosition, maxWaitTimeInSeconds: 1 });
    });
}

async function main() {
    const producer = new EventHubProducerClient(scenario.connectionString, options);
    const consumer = new EventHubConsumerClient("$Default", scenario.connectionString, options);
    try {
        say({ ids: await producer.getPartitionIds() });
        const batch = await producer.createBatch();
        for (let n = 0; n < scenario.count; n++) {
            batch.tryAdd({ body: { n } });
        }
        await producer.sendBatch(batch);
        say({ received: await receive(consumer, scenario.count) });
    } catch (error) {
        say({ error: error.name, code: error.code, message: error.message });
    } finally {
        await producer.close();
        await consumer.close();
    }
}

main().catch((error) => {
    process.stderr.write(String(error && error.stack || error) + "\n");
    process.exit(1);
});
