'use strict';
// Runs FTN18 calls through the official FutoIn client and prints one JSON line per call:
// {"ok": result} or {"error": name, "desc": text}.
// Usage: node calls.js '{"endpoint": ..., "credentials": ..., "calls": [...]}'
// A call: {"face": "gen"|"poll"|"push", "version": "1.1", "method": "addEvent", "args": [...]}
// or, sent without the client checking it against the spec first:
//         {"raw": "futoin.evt.gen:1.1", "method": "addEvent", "params": {...}}

const $as = require( 'futoin-asyncsteps' );
const AdvancedCCM = require( 'futoin-invoker/AdvancedCCM' );
const SimpleCCM = require( 'futoin-invoker/SimpleCCM' );
const GenFace = require( 'futoin-eventstream/GenFace' );
const PollFace = require( 'futoin-eventstream/PollFace' );
const PushFace = require( 'futoin-eventstream/PushFace' );

const FACES = { gen: GenFace, poll: PollFace, push: PushFace };
const scenario = JSON.parse( process.argv[2] );
const ccm = new AdvancedCCM();
const raw_ccm = new SimpleCCM();
const results = [];

$as()
    .add( ( as ) => {
        as.forEach( scenario.calls, ( as, i, call ) => {
            const name = `call_${i}`;
            const used = call.raw ? raw_ccm : ccm;
            as.add(
                ( as ) => {
                    const options = { version: call.version, limitZone: 'unlimited' };
                    if ( call.raw ) {
                        raw_ccm.register(
                            as, name, call.raw, scenario.endpoint, scenario.credentials, options );
                        as.add( ( as ) => raw_ccm.iface( name ).call( as, call.method, call.params ) );
                    } else {
                        FACES[call.face].register(
                            as, ccm, name, scenario.endpoint, scenario.credentials, options );
                        as.add( ( as ) => ccm.iface( name )[call.method]( as, ...call.args ) );
                    }
                    as.add( ( as, res ) => results.push( { ok: res } ) );
                },
                ( as, err ) => {
                    results.push( { error: err, desc: as.state.error_info || '' } );
                    as.success();
                } );
            as.add( ( as ) => used.unRegister( name ) );
        } );
    }, ( as, err ) => {
        console.error( `scenario failed: ${err}: ${as.state.error_info}` );
        process.exitCode = 2;
    } )
    .add( ( as ) => {
        for ( const r of results ) {
            process.stdout.write( JSON.stringify( r ) + '\n' );
        }
        ccm.close();
        raw_ccm.close();
    } )
    .execute();
