'use strict';
// The official FutoIn reference event stream server (futoin-eventstream on SQLite), for benchmarks.
// Usage: node reference_server.js DB_FILE PORT USER PASSWORD
// The database must already have the reference schema (the bench harness creates it).
// Prints "READY" once it listens on ws://127.0.0.1:PORT/.

// moment (through the SQLite driver) must load before futoin-executor hardens built-in prototypes.
require( 'futoin-database/SQLiteService' );
const $as = require( 'futoin-asyncsteps' );
const { AdvancedCCM } = require( 'futoin-invoker' );
const NodeExecutor = require( 'futoin-executor/NodeExecutor' );
const LegacySecurityProvider = require( 'futoin-executor/LegacySecurityProvider' );
const DBAutoConfig = require( 'futoin-database/AutoConfig' );
const DBGenService = require( 'futoin-eventstream/DBGenService' );
const DBPushService = require( 'futoin-eventstream/DBPushService' );

const [ db_file, port, user, password ] = process.argv.slice( 2 );
const ccm = new AdvancedCCM();

$as()
    .add( ( as ) => {
        const secprov = new LegacySecurityProvider( as, ccm );
        secprov.addUser( user, password, {} );
        const executor = new NodeExecutor( ccm, {
            httpAddr: '127.0.0.1',
            httpPort: parseInt( port ),
            httpPath: '/',
            securityProvider: secprov,
            secureChannel: true,
        } );
        executor.on( 'notExpected', ( ...args ) => console.error( 'notExpected', args ) );
        DBAutoConfig( as, ccm, { evt: {} }, { DB_EVT_TYPE: 'sqlite', DB_EVT_SOCKET: db_file } );
        as.add( ( as ) => {
            DBGenService.register( as, executor );
            DBPushService.register( as, executor );
        } );
        as.add( ( _as ) => console.log( 'READY' ) );
    }, ( as, err ) => {
        console.error( `reference server failed: ${err}: ${as.state.error_info}`, as.state.last_exception );
        process.exit( 1 );
    } )
    .execute();

process.on( 'SIGTERM', () => {
    ccm.close();
    process.exit( 0 );
} );
